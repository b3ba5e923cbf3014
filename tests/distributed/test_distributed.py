"""Sharded Shampoo under torch.distributed (gloo on CPU), the sharding plan and the planner.

The spawned tests start one process group of 2 and one of 3 ranks. Each rank runs
every scenario side by side with a single-process ``Shampoo`` (``distributed=None``)
fed the same gradients, and writes what it saw to a JSON file the test then checks.
What is asserted, and why not more:

* Every rank holds the same parameters **bit for bit** after every step (each block's
  update is computed by exactly one rank and the all-gather copies it), and a
  sharded run resumed from its own checkpoint continues bit for bit.
* Against the single-process run the parameters agree to rounding
  (:data:`ROUNDING_ATOL`), not bit for bit: batched matmul kernels (MKL here) give a
  matrix slightly different bits depending on its position in the stack (memory
  alignment) and on the batch count, and a rank's local stack holds other matrices
  at other positions than the single-process stack. A wrong block assignment or a
  lost update moves parameters by about ``lr`` = 5e-2, far above the tolerance.

The process groups are spawned by :mod:`spawned_ranks`.
"""

from __future__ import annotations

import pytest
import torch
from sharded_scenarios import (METHODS, OPTIONS, ROUNDING_ATOL, SHAPES, STEPS,
                               _assert_matches_single_process, _memory_scenario, _scenarios)
from spawned_ranks import run_on_ranks

from matroot.optim import Shampoo
from matroot.optim.distributed.cluster_sizing import plan_summary


def _every_scenario(rank, world, tmpdir):
    """The sharded scenarios, then (last: its refusals are raised on every rank) the
    ranks holding other models, all in one spawned process group."""
    return {**_scenarios(rank, world, tmpdir),
            "other_models": _ranks_with_other_models(rank, world, tmpdir)}


def _all_scenarios(world, tmp_path_factory):
    return run_on_ranks(_every_scenario, world, str(tmp_path_factory.mktemp(f"dist{world}")))


@pytest.fixture(scope="module")
def ranks_2(tmp_path_factory):
    return _all_scenarios(2, tmp_path_factory)


@pytest.fixture(scope="module")
def ranks_3(tmp_path_factory):
    return _all_scenarios(3, tmp_path_factory)


@pytest.fixture(params=[2, 3], ids=lambda w: f"{w}ranks")
def ranks(request):
    """Every rank's results of one spawned run of all scenarios."""
    world = request.param
    return world, request.getfixturevalue(f"ranks_{world}")




@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """Four ranks run the equality scenario only: enough to measure the state per rank."""
    return run_on_ranks(_memory_scenario, 4, str(tmp_path_factory.mktemp("dist4")))


def test_backend_is_gloo(ranks):
    _, results = ranks
    assert all(r["backend"] == "gloo" for r in results)


def test_sharded_run_agrees_across_ranks_and_with_single_process(ranks):
    world, results = ranks
    method = METHODS[world]
    for r in results:
        eq = r["equality"][method]
        assert eq["sharded"], "Shampoo did not shard although torch.distributed was up"
        assert eq["root_refreshes"] >= 4, "the run must reach the preconditioned phase"
        # Before start_preconditioning_step every update is the elementwise Adam one, so
        # bit-identical; later steps agree to rounding (docs/distributed.rst), because
        # batched matmul and eigh need not round alike at every batch offset.
        before = OPTIONS["start_preconditioning_step"] - 1
        assert before >= 1 and eq["updates_equal"][:before] == [True] * before
    _assert_matches_single_process([r["equality"] for r in results], method, f"{world} ranks")
    assert sum(r["equality"][method]["owned_blocks"] for r in results) == \
        results[0]["equality"][method]["total_blocks"]


def test_parameter_groups_with_their_own_stacks_are_sharded_too(ranks):
    world, results = ranks
    for r in results:
        assert r["two_families"]["families"] == [True, True]
    _assert_matches_single_process(results, "two_families", f"{world} ranks")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_memory_per_rank_is_below_single_process(world, request):
    """Counted by walking each rank's whole state dict: a rank keeps the stacks of its own
    blocks and the moments of exactly the elements it owns (its blocks', its elementwise
    parameters'), so only a step counter per parameter it owns part of is repeated."""
    if world == 4:
        results = request.getfixturevalue("four_ranks")
    else:
        results = request.getfixturevalue("ranks_" + str(world))
    eq = [r["equality"][METHODS[world]] for r in results]
    for rank, e in enumerate(eq):
        assert e["stack_bytes"] < e["single_stack_bytes"], f"rank {rank}"
        counters = 8 * e["step_counters"]        # one float64 step per parameter kept
        assert e["state_dict_bytes"] <= 1.1 / world * e["single_state_dict_bytes"] + counters, \
            f"rank {rank}: {e['state_dict_bytes']} of {e['single_state_dict_bytes']} bytes"
    # Factors, roots and moments are split, not copied: they add up to the single process's.
    assert sum(e["stack_bytes"] for e in eq) == eq[0]["single_stack_bytes"]
    assert sum(e["state_bytes"] for e in eq) == eq[0]["single_state_bytes"]
    # The planner predicts the largest rank's stacks and moments.
    planned = plan_summary([(str(i), s) for i, s in enumerate(SHAPES)], block_size=8,
                           world_sizes=[world])["worlds"][0]
    assert planned["preconditioner"] == max(e["stack_bytes"] for e in eq)
    assert planned["moments"] == max(e["state_bytes"] - e["stack_bytes"] for e in eq)


def test_all_gather_volume_is_what_the_planner_says(ranks):
    world, results = ranks
    planned = plan_summary([(str(i), s) for i, s in enumerate(SHAPES)], block_size=8,
                           world_sizes=[world])["worlds"][0]["allgather_bytes"]
    for r in results:
        gathered = r["equality"][METHODS[world]]["gathered_bytes"]
        # Shared at every step: a rank has no moments for parameters it owns no block of.
        assert gathered == [planned] * STEPS


def test_failed_roots_fall_back_like_single_process(ranks):
    world, results = ranks
    owners = results[0]["failed_roots"]["owners"]
    assert len(owners) == 1, "the failing block has one owner"
    for rank, r in enumerate(results):
        fr = r["failed_roots"]
        assert fr["finite"]
        if rank not in owners:
            assert fr["failures"] == 0, f"rank {rank} owns none of the failing blocks"
    assert sum(r["failed_roots"]["failures"] for r in results) == \
        results[0]["failed_roots"]["single_failures"] > 0
    _assert_matches_single_process(results, "failed_roots", f"{world} ranks")


def test_roots_not_kept_shard_like_kept_roots(ranks):
    world, results = ranks
    for r in results:
        assert all(r["roots_not_kept"]["roots"]) and r["roots_not_kept"]["refreshes"] >= 4
        assert r["roots_not_kept"]["updates_equal"][0]      # step 1: the Adam update
    _assert_matches_single_process(results, "roots_not_kept", f"{world} ranks")


def test_a_rank_that_owns_nothing_still_shares_the_updates(ranks):
    world, results = ranks
    pieces = [r["idle_ranks"]["pieces"] for r in results]
    assert sorted(pieces)[-2:] == [1, 1], pieces   # the block's owner, the vector's
    assert [r["idle_ranks"]["kept"] for r in results] == pieces
    if world == 3:
        assert 0 in pieces
    _assert_matches_single_process(results, "idle_ranks", f"{world} ranks")


def test_nan_on_one_rank_makes_every_rank_raise_or_skip(ranks):
    world, results = ranks
    for rank, r in enumerate(results):
        nf = r["nonfinite"]
        assert nf["raise"] == "raised", f"rank {rank} did not raise"
        assert "[2]" in nf["raise_message"]
        assert nf["skip"] == "stepped" and nf["skip_unchanged"] and nf["skip_skipped"] == 1
        assert nf["raise_continued_steps"] == 2 and nf["skip_continued_steps"] == 2
        assert nf["mismatch"] == "raised", f"rank {rank}: missing gradient not agreed"


def test_a_skipped_step_counts_in_the_schedule_as_in_one_process(ranks):
    _, results = ranks
    for rank, r in enumerate(results):
        r = r["skip_schedule"]
        assert r["sharded"] == r["single"] == [3, 6], rank
        assert r["skipped"] == 1 and r["max_diff"] <= ROUNDING_ATOL, rank
    assert len({r["skip_schedule"]["digest"] for r in results}) == 1


def test_checkpoint_restore_consolidate_and_reshard(ranks):
    world, results = ranks
    for rank, r in enumerate(results):
        ck = r["checkpoint"]
        assert ck["shard_record"] == world
        assert ck["resumed_equal"], f"rank {rank}: resuming its own shard is not bit-exact"
        assert ck["consolidated_failures_equal"], f"rank {rank}"
        assert ck["old_layout_trimmed"], f"rank {rank}: old-layout moments not cut to its own"
        for name in ("resumed_diff_single", "consolidated_stacks_diff", "consolidated_diff",
                     "resharded_diff", "old_layout_diff", "old_layout_consolidated_diff"):
            assert ck[name] <= ROUNDING_ATOL, f"rank {rank}: {name} = {ck[name]:g}"
        assert "consolidate_state_dicts" in ck["wrong_rank"] or "rank" in ck["wrong_rank"]


def _ranks_with_other_models(rank, world, tmpdir):
    """Rank-side scenarios of the test below: pipeline-like stages (other shapes on
    each rank), then same shapes with per-rank values, then DDP replicas."""
    out = {}
    stages = ([torch.nn.Linear(8, 16)] if rank == 0 else
              [torch.nn.Linear(16, 4), torch.nn.Linear(4, 4)])
    torch.manual_seed(rank)
    per_rank = torch.nn.Linear(8, 4)
    torch.manual_seed(0)
    replica = torch.nn.Linear(8, 4)
    for name, modules in (("stages", stages), ("per_rank", [per_rank]),
                          ("replica", [replica])):
        params = [p for m in modules for p in m.parameters()]
        opt = Shampoo(params)
        for p in params:
            p.grad = torch.ones_like(p)
        try:
            opt.step()
            out[name] = "stepped"
        except ValueError as error:
            out[name] = str(error)
    return out


def test_sharded_shampoo_refuses_ranks_that_hold_other_models(ranks):
    """``distributed="auto"`` shards over every initialised process group: pipeline
    stages (other shapes per rank) crashed inside gloo (``EnforceNotMet``, a SIGABRT)
    and per-rank models silently took each other's updates. (Run in the spawn of the
    other scenarios, after them: a process group costs far more than the check.)"""
    _, results = ranks
    for result in (r["other_models"] for r in results):
        assert "different shapes" in result["stages"]
        assert "different values" in result["per_rank"]
        assert "distributed=None" in result["per_rank"]
        assert result["replica"] == "stepped"
