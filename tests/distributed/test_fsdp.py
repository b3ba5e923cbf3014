"""Shampoo on FSDP2 (``fully_shard``) and other DTensor parameters, gloo on CPU.

One process group of 2 and one of 3 ranks (:mod:`spawned_ranks`). Each rank trains
a tiny model sharded with ``fully_shard`` (an embedding, two linear layers whose
first dimensions, 11 and 5, divide by neither world size, 1-D biases), plus a plain
parameter and a ``Replicate`` DTensor (a mixed model), side by side with an
unsharded copy and a single-process ``Shampoo`` fed the same batches.

What is asserted, and why not more: every rank feeds the same batch, so FSDP2's
reduce-scatter averages ``world`` equal gradients, which equals the single-process
gradient up to the rounding of that average; and a rank's factor stacks hold other
blocks at other positions than the single-process stacks, which batched kernels
may round differently (tests/distributed/test_distributed.py). The parameters therefore agree
with the single process to rounding (:data:`ROUNDING_ATOL`), where a wrong block,
a lost update or a shard applied to the wrong rows moves them by about ``lr``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from spawned_ranks import run_on_ranks, two_then_three_ranks

from matroot.optim import Shampoo

fsdp = pytest.importorskip("torch.distributed.fsdp")
tensor_api = pytest.importorskip("torch.distributed.tensor")
from fsdp_scenarios import (HSDP_MESH, OPTIONS, RESUMED, ROUNDING_ATOL,  # noqa: E402
                            SAVED_AT, Tiny, _hsdp_scenarios, _scenarios, _steps)


base, two_ranks, three_ranks, ranks = two_then_three_ranks(_scenarios, "fsdp")


def test_fsdp2_run_equals_single_process_to_rounding(ranks):
    world, results = ranks
    for rank, r in enumerate(results):
        eq = r["equality"]
        assert eq["sharded"] and eq["dtensors"] == 6, f"rank {rank}"
        assert eq["refreshes"] >= 2, "the run must reach the preconditioned phase"
        assert max(eq["diffs"]) <= ROUNDING_ATOL, f"rank {rank}: {eq['diffs']}"
    # The uneven first dimensions really are cut unevenly (one rank holds fewer rows).
    rows = [[shape[0] for shape in r["equality"]["shard_rows"]] for r in results]
    assert sum(row[0] for row in rows) == 11 and len({row[0] for row in rows}) == 2


def test_every_rank_ends_with_identical_parameters(ranks):
    _, results = ranks
    assert len({r["equality"]["digest"] for r in results}) == 1
    # The plain and the Replicate parameters are each rank's own copies: equal bit for bit
    # (one owner computed each block's update, the all-gather copied it).
    assert len({r["equality"]["replicated_digest"] for r in results}) == 1
    # The shards differ between ranks (each holds other rows), as FSDP2 requires.
    assert len({r["equality"]["local_digest"] for r in results}) == len(results)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_per_rank_state_is_a_share_of_the_single_process_state(world, request):
    """Counted by walking each rank's whole state dict. Each rank keeps the stacks of
    its own blocks and the moments of exactly the elements it owns (its blocks', its
    biases' and other elementwise parameters'); what repeats is one step counter per
    parameter a rank owns part of. Four ranks: the HSDP run, whose blocks are split
    over all four ranks as a 1-D FSDP2 mesh's would be."""
    if world == 4:
        results = [r["hsdp"] for r in request.getfixturevalue("hsdp_ranks")]
    else:
        results = [r["equality"] for r in
                   request.getfixturevalue({2: "two_ranks", 3: "three_ranks"}[world])]
    for rank, eq in enumerate(results):
        counters = 8 * eq["step_counters"]      # one float64 step per parameter kept
        assert eq["state_bytes"] <= 1.1 / world * eq["single_state_bytes"] + counters, \
            f"rank {rank}: {eq['state_bytes']} of {eq['single_state_bytes']} bytes"


def test_nan_on_one_rank_is_handled_alike_on_every_rank(ranks):
    _, results = ranks
    for rank, r in enumerate(results):
        assert r["nan_raise"]["outcomes"] == ["stepped", "stepped", "raised", "stepped"], rank
        assert r["nan_skip"]["outcomes"] == ["stepped"] * 4 and r["nan_skip"]["skipped"] == 1
        # A skipped step changes nothing: the run stays with the reference that left it out.
        assert max(r["nan_skip"]["diffs"]) <= ROUNDING_ATOL, f"rank {rank}"
    assert len({r["nan_skip"]["digest"] for r in results}) == 1


def _max_diff(a, b) -> float:
    return max(float((torch.tensor(x) - torch.tensor(y)).abs().max()) for x, y in zip(a, b))


def test_dcp_checkpoint_saved_at_two_ranks_resumes_at_three(two_ranks, three_ranks):
    uninterrupted = two_ranks[0]["uninterrupted"]
    assert all(r["uninterrupted"] == uninterrupted for r in two_ranks)
    for rank, r in enumerate(three_ranks):
        assert _max_diff(r["dcp"]["resumed"], uninterrupted) <= ROUNDING_ATOL, f"rank {rank}"


def test_dcp_checkpoint_saved_at_two_ranks_resumes_in_one_process(two_ranks, base):
    import torch.distributed.checkpoint as dcp

    from matroot.optim.distributed.checkpoint import load_dcp_state_dict

    assert not dist.is_initialized()
    model = Tiny()
    opt = Shampoo(list(model.parameters()), **OPTIONS)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(base / "dcp"))
    model.load_state_dict(state["model"])
    load_dcp_state_dict(opt, str(base / "dcp"))
    _steps(model, opt, SAVED_AT, RESUMED)
    resumed = [p.detach().tolist() for p in model.parameters()]
    assert _max_diff(resumed, two_ranks[0]["uninterrupted"]) <= ROUNDING_ATOL
    with pytest.raises(ValueError, match="no Shampoo state under 'optimizer'"):
        load_dcp_state_dict(opt, str(base / "dcp"), key="optimizer")


def test_broken_or_mismatched_dcp_checkpoints_are_refused_clearly(three_ranks):
    for r in three_ranks:
        out = r["dcp"]
        assert "rank1_of_2 cannot be read" in out["error_garbled"], out["error_garbled"]
        assert "incomplete" in out["error_incomplete"], out["error_incomplete"]
        assert "doesn't match the size" in out["error_dcp"], out["error_dcp"]


def test_planner_predicts_the_fsdp2_shards(ranks):
    """``matroot plan --fsdp2``'s parameter bytes are the largest rank's real shards."""
    import math

    from matroot.optim.distributed.cluster_sizing import plan_summary

    world, results = ranks
    shapes = [(name, tuple(p.shape)) for name, p in Tiny().named_parameters()]
    planned = plan_summary(shapes, block_size=4, world_sizes=[world])["worlds"][0]["fsdp2"]
    fsdp_shards = len(shapes)     # the extras (plain, Replicate) come after the model's
    largest = max(sum(math.prod(s) for s in r["equality"]["shard_rows"][:fsdp_shards])
                  for r in results)
    assert planned["parameters"] == planned["gradients"] == 4 * largest
    assert planned["gradient_gather_bytes"] == 4 * sum(math.prod(s) for _, s in shapes)


@pytest.fixture(scope="module")
def hsdp_ranks(base):
    tmpdir = base / "hsdp"
    tmpdir.mkdir()
    return run_on_ranks(_hsdp_scenarios, math.prod(HSDP_MESH), str(tmpdir))


def test_hsdp_run_equals_single_process_to_rounding(hsdp_ranks):
    """HSDP (a 2×2 mesh: two replicas, each sharded over two ranks) takes the FSDP2
    route: whole gradients, blocks split over all four ranks of the default group.
    The parameters agree with one process to rounding and are the same on every rank."""
    results = [r["hsdp"] for r in hsdp_ranks]
    for rank, r in enumerate(results):
        assert r["sharded"] and r["refreshes"] >= 2, f"rank {rank}"
        assert "(Replicate(), Shard(dim=0))" in r["placements"], r["placements"]
        assert max(r["diffs"]) <= ROUNDING_ATOL, f"rank {rank}: {r['diffs']}"
    assert len({r["digest"] for r in results}) == 1
    # Replicas hold equal shards: two distinct local digests among four ranks.
    assert len({r["local_digest"] for r in results}) == HSDP_MESH[1]
