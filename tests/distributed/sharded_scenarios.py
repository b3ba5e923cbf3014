"""Rank-side scenarios of ``test_distributed.py``: each runs sharded Shampoo side by side
with a single-process ``Shampoo`` (``distributed=None``) fed the same gradients, on
every rank of a spawned gloo process group (:mod:`spawned_ranks`), and returns what it
saw for the tests to check. A module of its own so that the spawned ranks import it
(the scenarios must be module-level functions) and the test file stays short.
"""

from __future__ import annotations

import copy
import hashlib
import os

import torch
import torch.distributed as dist
from spawned_ranks import state_dict_bytes

from matroot.optim import Shampoo
from matroot.optim.shampoo_core import core
from matroot.optim.shampoo_core.blocking import ELEMENTWISE, plan_blocks
from matroot.optim.distributed.core import (
    GradientMismatchError,
    consolidate_state_dicts,
    shard_state_dict,
)
from matroot.optim.distributed.rank_part import local_plan
from matroot.optim.distributed.sharding import (
    shard_plan,
)


# Many block shapes at block_size 8: 8x8, 8x4, 4x8, 4x4, 8x1, 1x8, 1x1, a merged
# 3-D tensor (3x35), a squeezed one (6x10), vectors left to the Adam update, and
# one parameter that is a single block of a shape of its own (5x7, the last).
SHAPES = [(20, 12), (12, 12), (9, 17), (3, 5, 7), (33,), (16, 8), (1, 6), (6, 1, 10), (5, 7)]
LONE_BLOCK = len(SHAPES) - 1
OPTIONS = dict(lr=0.05, weight_decay=0.01, block_size=8, precondition_frequency=2,
               start_preconditioning_step=2)
STEPS = 10
#: Largest parameter difference, sharded against single-process, that rounding explains:
#: differences of ~1e-7 in a root grow to ~1e-4 over the 10 steps of these tests.
ROUNDING_ATOL = 2e-3


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def _set_grads(params, step, scale=None):
    """Gradients that depend on the parameters, identical on every rank (as after DDP)."""
    gen = torch.Generator().manual_seed(1000 + step)
    for i, p in enumerate(params):
        p.grad = 0.3 * p.detach() ** 3 + torch.randn(p.shape, generator=gen)
        if scale is not None and i in scale:
            p.grad = p.grad * scale[i]


def _equal(a, b) -> bool:
    return all(torch.equal(x.detach(), y.detach()) for x, y in zip(a, b))


def _max_diff(a, b) -> float:
    return max(float((x.detach() - y.detach()).abs().max()) for x, y in zip(a, b))


def _digest(tensors) -> str:
    """A hash of the exact bits of ``tensors``, to compare ranks with each other."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _assert_matches_single_process(results, key, where=""):
    """Ranks agree bit for bit; each agrees with the single process to rounding."""
    digests = {r[key]["digest"] for r in results}
    assert len(digests) == 1, f"{where}: ranks hold different parameters"
    for rank, r in enumerate(results):
        assert r[key]["max_diff"] <= ROUNDING_ATOL, (
            f"{where} rank {rank}: parameters differ from the single process by "
            f"{r[key]['max_diff']:g} (steps with bitwise-equal updates: {r[key]['updates_equal']})")


def _groups(params, split):
    """Two parameter groups that differ in block_size: two families, each split on its own."""
    if split is None:
        return params
    return [{"params": params[:split]},
            {"params": params[split:], "block_size": 6, "lr": 0.02}]


def _run_side_by_side(rank, options, steps, scale_at=None, split_groups=None):
    """A sharded and a single-process optimizer stepped on the same gradients."""
    sharded, single = _params(), _params()
    opt = Shampoo(_groups(sharded, split_groups), **options)
    ref = Shampoo(_groups(single, split_groups), distributed=None, **options)
    opt._form_families()
    sharding = opt._families[0].sharding
    gathered = []
    if sharding is not None:
        share = sharding.share_updates

        def share_and_count(*args):
            updates, count = share(*args)
            gathered.append(count)
            return updates, count

        sharding.share_updates = share_and_count
    update_equal, first_mismatch = [], None
    for step in range(steps):
        scale = scale_at.get(step) if scale_at else None
        _set_grads(sharded, step, scale)
        _set_grads(single, step, scale)
        before_s = [p.detach().clone() for p in sharded]
        before_r = [p.detach().clone() for p in single]
        opt.step()
        ref.step()
        ok = _equal([p - b for p, b in zip(sharded, before_s)],
                    [p - b for p, b in zip(single, before_r)])
        update_equal.append(ok)
        if not ok and first_mismatch is None:
            first_mismatch = step
    return opt, ref, sharded, single, {
        "updates_equal": update_equal, "first_mismatch": first_mismatch,
        "params_equal": _equal(sharded, single), "max_diff": _max_diff(sharded, single),
        "digest": _digest(sharded), "gathered_bytes": gathered}


#: The solver each world size runs: the CPU default (eigh) and the iterative one GPUs use.
METHODS = {2: "auto", 3: "newton_db", 4: "auto"}


def _scenario_equality(rank, world):
    out = {}
    for method in (METHODS[world],):
        opt, ref, _, _, result = _run_side_by_side(rank, dict(OPTIONS, root_method=method),
                                                  STEPS)
        sharding = opt._families[0].sharding
        st, rt = core.state_bytes(opt._families[0].state), core.state_bytes(ref._families[0].state)
        result.update(
            sharded=sharding is not None,
            owned_blocks=sharding.local.num_blocks if sharding else None,
            total_blocks=ref._families[0].state.plan.num_blocks,
            state_bytes=st["total"], single_state_bytes=rt["total"],
            state_dict_bytes=state_dict_bytes(opt.state_dict()),
            single_state_dict_bytes=state_dict_bytes(ref.state_dict()),
            step_counters=len(opt.state),
            stack_bytes=st["factors"] + st["roots"] + st["counters"],
            single_stack_bytes=rt["factors"] + rt["roots"] + rt["counters"],
            root_refreshes=ref.diagnostics()["root_refreshes"])
        out[method] = result
    return out


def _scenario_two_families(rank, world):
    opt, _, _, _, result = _run_side_by_side(rank, OPTIONS, 6, split_groups=5)
    result["families"] = [f.sharding is not None for f in opt._families]
    return result


def _scenario_failed_roots(rank, world):
    """Huge gradients on one block from step 3 on: its factors overflow to Inf."""
    probe = Shampoo(_params(), **OPTIONS)
    probe._form_families()
    sharding = probe._families[0].sharding
    owners = sorted({r for g, group in enumerate(sharding.plan.groups)
                     for r, (a, b) in enumerate(sharding.split.ranges(g))
                     for block in group.blocks[a:b] if block.param == LONE_BLOCK})
    scale_at = {s: {LONE_BLOCK: 1e20} for s in range(3, STEPS)}
    opt, ref, _, _, result = _run_side_by_side(rank, OPTIONS, STEPS, scale_at)
    result.update(failures=opt.diagnostics()["root_failures"],
                  single_failures=ref.diagnostics()["root_failures"], owners=owners,
                  finite=all(bool(torch.isfinite(p).all()) for p in opt.param_groups[0]["params"]))
    return result


def _scenario_roots_not_kept(rank, world):
    """Roots solved every step and not kept: each rank solves only the stacks it owns."""
    options = dict(OPTIONS, precondition_frequency=1, keep_roots=False)
    opt, ref, _, _, result = _run_side_by_side(rank, options, 6)
    result.update(roots=[r is None for r in opt._families[0].state.roots],
                  refreshes=opt.diagnostics()["root_refreshes"])
    return result


def _scenario_nonfinite(rank, world):
    """NaN in rank 0's local gradient only: every rank must raise (or skip) together."""
    out = {}
    for policy in ("raise", "skip"):
        params = _params()
        opt = Shampoo(params, **dict(OPTIONS, nonfinite_grads=policy))
        _set_grads(params, 0)
        opt.step()
        before = [p.detach().clone() for p in params]
        _set_grads(params, 1)
        if rank == 0:
            params[2].grad[0, 0] = float("nan")
        try:
            opt.step()
            outcome = "stepped"
        except core.NonFiniteGradientError as err:
            outcome = "raised"
            out[f"{policy}_message"] = str(err)
        out[policy] = outcome
        out[f"{policy}_unchanged"] = _equal(params, before)
        out[f"{policy}_skipped"] = opt.diagnostics()["skipped_steps"]
        # The run goes on afterwards, on every rank, with the same collectives.
        _set_grads(params, 2)
        opt.step()
        out[f"{policy}_continued_steps"] = opt.diagnostics()["steps"]
    params = _params()
    opt = Shampoo(params, **OPTIONS)
    _set_grads(params, 0)
    if rank == world - 1:
        params[0].grad = None
    try:
        opt.step()
        out["mismatch"] = "stepped"
    except GradientMismatchError:
        out["mismatch"] = "raised"
    return out


def _scenario_skip_schedule(rank, world):
    """Issue 36's rule: a NaN step skipped while sharded counts in the root schedule as
    it does in one process (refreshes at 3 and 6 with a NaN at step 2 of 8, frequency 3)."""
    options = dict(OPTIONS, nonfinite_grads="skip", precondition_frequency=3,
                   start_preconditioning_step=3)
    sharded, single = _params(), _params()
    opt = Shampoo(sharded, **options)
    ref = Shampoo(single, distributed=None, **options)
    refreshed: dict = {"sharded": [], "single": []}
    for step in range(1, 9):
        for name, o, params in (("sharded", opt, sharded), ("single", ref, single)):
            _set_grads(params, step)
            if step == 2 and (rank == 0 or name == "single"):
                params[1].grad[0, 0] = float("nan")
            before = int(o._families[0].state.root_refreshes) if o._families else 0
            o.step()
            if int(o._families[0].state.root_refreshes) > before:
                refreshed[name].append(step)
    return {**refreshed, "max_diff": _max_diff(sharded, single), "digest": _digest(sharded),
            "skipped": opt.diagnostics()["skipped_steps"]}


def _scenario_idle_ranks(rank, world):
    """A model of one block and one float64 vector: the block's owner, the vector's owner
    and, at 3 ranks, a rank that owns nothing all step, share updates and agree."""
    gen = torch.Generator().manual_seed(3)
    # The vector in float64: its update travels in an all-gather of its own dtype.
    start = [torch.randn(6, 4, generator=gen), torch.randn(3, generator=gen).double()]
    mine = [torch.nn.Parameter(t.clone()) for t in start]
    alone = [torch.nn.Parameter(t.clone()) for t in start]
    opt = Shampoo(mine, **OPTIONS)
    ref = Shampoo(alone, distributed=None, **OPTIONS)
    for step in range(4):
        _set_grads(mine, step)
        _set_grads(alone, step)
        opt.step()
        ref.step()
    return {"pieces": len(opt._families[0].sharding.pieces), "kept": len(opt.state),
            "digest": _digest(mine), "max_diff": _max_diff(mine, alone),
            "updates_equal": []}


def _scenario_checkpoint(rank, world, tmpdir):
    """Save at step 5, restore, run to 10; consolidate and re-shard the checkpoint."""
    half = STEPS // 2
    opt, ref, sharded, single, _ = _run_side_by_side(rank, OPTIONS, half)
    torch.save({"params": [p.detach() for p in sharded], "optim": opt.state_dict()},
               os.path.join(tmpdir, f"ckpt-{world}-{rank}.pt"))
    ref_sd = copy.deepcopy(ref.state_dict())  # the live one changes in place
    saved_single = [p.detach().clone() for p in single]
    for step in range(half, STEPS):
        _set_grads(sharded, step)
        _set_grads(single, step)
        opt.step()
        ref.step()
    dist.barrier()

    out = {}
    # 1. Same world size: each rank reloads its own shard.
    ckpt = torch.load(os.path.join(tmpdir, f"ckpt-{world}-{rank}.pt"))
    resumed = [torch.nn.Parameter(p.clone()) for p in ckpt["params"]]
    opt2 = Shampoo(resumed, **OPTIONS)
    opt2.load_state_dict(ckpt["optim"])
    for step in range(half, STEPS):
        _set_grads(resumed, step)
        opt2.step()
    out["resumed_equal"] = _equal(resumed, sharded)
    out["resumed_diff_single"] = _max_diff(resumed, single)
    out["shard_record"] = ckpt["optim"]["shampoo_families"][0]["shard"]["world_size"]

    # 2. Consolidated into one single-process state dict (what a rank-0 export does).
    shards = [torch.load(os.path.join(tmpdir, f"ckpt-{world}-{r}.pt"))["optim"]
              for r in range(world)]
    merged = consolidate_state_dicts(shards)
    out["consolidated_stacks_diff"] = _max_diff(
        *([stack for name in ("factors", "roots") for stack in sd["shampoo_families"][0][name]]
          for sd in (merged, ref_sd)))
    out["consolidated_failures_equal"] = _equal(merged["shampoo_families"][0]["root_failures"],
                                                ref_sd["shampoo_families"][0]["root_failures"])
    alone = [torch.nn.Parameter(p.clone()) for p in saved_single]
    opt3 = Shampoo(alone, distributed=None, **OPTIONS)
    opt3.load_state_dict(merged)
    for step in range(half, STEPS):
        _set_grads(alone, step)
        opt3.step()
    out["consolidated_diff"] = _max_diff(alone, single)

    # 3. A single-process checkpoint sharded for this world size.
    again = [torch.nn.Parameter(p.clone()) for p in saved_single]
    opt4 = Shampoo(again, **OPTIONS)
    opt4.load_state_dict(shard_state_dict(ref_sd, world, rank))
    for step in range(half, STEPS):
        _set_grads(again, step)
        opt4.step()
    out["resharded_diff"] = _max_diff(again, single)

    # 4. A per-rank checkpoint of the layout before a rank kept only its own elements'
    # moments: whole-parameter moments wherever a rank owned a block, the elementwise
    # parameters' on every rank, no elementwise owners in the split. Loaded, it is cut
    # to this rank's elements; consolidated, it merges as the new layout does.
    def aged(shard, rank):
        old = copy.deepcopy(shard)
        family = old["shampoo_families"][0]
        family["shard"]["split"].pop("elementwise")
        plan = plan_blocks(SHAPES, ["float32"] * len(SHAPES), block_size=8)
        local, _ = local_plan(plan, shard_plan(plan, world), rank)
        touched = {b.param for g in local.groups for b in g.blocks} | \
            {i for i, layout in enumerate(plan.params) if layout.kind == ELEMENTWISE}
        old["state"] = {i: copy.deepcopy(ref_sd["state"][i]) for i in sorted(touched)}
        return old

    old_layout = [aged(shard_state_dict(ref_sd, world, r), r) for r in range(world)]
    again = [torch.nn.Parameter(p.clone()) for p in saved_single]
    opt5 = Shampoo(again, **OPTIONS)
    opt5.load_state_dict(old_layout[rank])
    kept = sum(v.numel() for entry in opt5.state.values() for v in entry.values())
    for step in range(half, STEPS):
        _set_grads(again, step)
        opt5.step()
    out["old_layout_diff"] = _max_diff(again, single)
    out["old_layout_trimmed"] = kept == sum(
        v.numel() for entry in shard_state_dict(ref_sd, world, rank)["state"].values()
        for v in entry.values())
    alone = [torch.nn.Parameter(p.clone()) for p in saved_single]
    opt6 = Shampoo(alone, distributed=None, **OPTIONS)
    opt6.load_state_dict(consolidate_state_dicts(old_layout))
    for step in range(half, STEPS):
        _set_grads(alone, step)
        opt6.step()
    out["old_layout_consolidated_diff"] = _max_diff(alone, single)

    # 5. A checkpoint of another rank is refused with a clear message.
    other = shards[(rank + 1) % world]
    try:
        Shampoo(_params(), **OPTIONS).load_state_dict(other)
        out["wrong_rank"] = "loaded"
    except ValueError as err:
        out["wrong_rank"] = str(err)
    return out


def _scenarios(rank, world, tmpdir):
    return {"equality": _scenario_equality(rank, world),
            "two_families": _scenario_two_families(rank, world),
            "failed_roots": _scenario_failed_roots(rank, world),
            "nonfinite": _scenario_nonfinite(rank, world),
            "skip_schedule": _scenario_skip_schedule(rank, world),
            "roots_not_kept": _scenario_roots_not_kept(rank, world),
            "idle_ranks": _scenario_idle_ranks(rank, world),
            "checkpoint": _scenario_checkpoint(rank, world, tmpdir)}


def _memory_scenario(rank, world, tmpdir):
    return {"equality": _scenario_equality(rank, world)}
