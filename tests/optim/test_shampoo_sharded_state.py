"""Shampoo's state split between ranks: state dicts that shard and consolidate, a DTensor
parameter in a world of one, and per-rank state that matches one process's."""

import math

import numpy as np
import pytest
from hang_guard import HANG_GUARD_S
from rounding import relative_distance, rounding_tolerance

torch = pytest.importorskip("torch")

from matroot.optim import Shampoo, ShampooConfig, init, update  # noqa: E402
from matroot.optim.shampoo_core import core  # noqa: E402
from shampoo_torch_runs import every_step_run  # noqa: E402


def test_roots_not_kept_shard_and_consolidate_without_roots():
    from matroot.optim.distributed.core import consolidate_state_dicts, shard_state_dict

    opt, _, _ = every_step_run(False, 2)
    sd = opt.state_dict()
    shards = [shard_state_dict(sd, 2, r) for r in (0, 1)]
    assert all(s["shampoo_families"][0]["roots"] == [None] * len(
        s["shampoo_families"][0]["factors"]) for s in shards)
    merged = consolidate_state_dicts(shards)["shampoo_families"][0]
    assert merged["roots"] == [None] * len(merged["factors"])
    for saved, again in zip(sd["shampoo_families"][0]["factors"], merged["factors"]):
        assert torch.equal(saved, again)


def test_packed_lazy_state_dicts_shard_and_consolidate():
    from matroot.optim.distributed.core import consolidate_state_dicts, shard_state_dict

    gen = torch.Generator().manual_seed(11)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(20, 12), (9, 17)]]
    idle = torch.nn.Parameter(torch.randn(5, 7, generator=gen))      # never gets a gradient
    opt = Shampoo(params + [idle], distributed=None, block_size=8, precondition_frequency=2,
                  symmetric_packing=True, root_storage_dtype="bfloat16")
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    sd = opt.state_dict()
    record = sd["shampoo_families"][0]
    assert any(f is None for f in record["factors"])                 # the idle one's stacks
    back = consolidate_state_dicts([shard_state_dict(sd, 2, r) for r in (1, 0)])
    merged = back["shampoo_families"][0]
    for name in ("factors", "roots"):
        for saved, again in zip(record[name], merged[name]):
            if saved is not None:
                assert torch.equal(saved, again)
            else:                   # a fresh stack: zero factors, identity roots, packed
                assert again.ndim == 2 and again.dtype == (
                    torch.float32 if name == "factors" else torch.bfloat16)
                n = (math.isqrt(8 * again.shape[1] + 1) - 1) // 2
                fresh = torch.zeros if name == "factors" else torch.eye
                expected = fresh(n, n)[tuple(torch.triu_indices(n, n))]
                assert torch.equal(again.float(), expected.expand_as(again))


def test_a_dtensor_parameter_in_a_world_of_one_steps_like_a_plain_tensor(tmp_path):
    """No optimizer process group (a world of one): the DTensor path alone. The core runs
    the same program on the same whole tensors as for the plain parameter, and the
    update is added elementwise to the same values, so bit for bit."""
    import subprocess
    import sys

    script = f"""
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from matroot.optim import Shampoo
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
try:
    start = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    weight = torch.nn.Parameter(distribute_tensor(start.clone(),
                                                  init_device_mesh("cpu", (1,)), [Shard(0)]))
    plain = torch.nn.Parameter(start.clone())
    opts = [Shampoo([w], block_size=4, precondition_frequency=1, weight_decay=0.1)
            for w in (weight, plain)]
    for step in range(3):
        grad = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        weight.grad = distribute_tensor(grad, weight.device_mesh, [Shard(0)])
        plain.grad = grad
        for opt in opts:
            opt.step()
    print(torch.equal(weight.full_tensor(), plain.detach()))
finally:
    dist.destroy_process_group()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False, timeout=HANG_GUARD_S)
    assert out.stdout.strip() == "True", out.stdout + out.stderr


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_rank_keeps_moments_only_where_it_owns_elements_and_its_blocks_match_one_process(
        world):
    from matroot.optim import apply_updates, state_bytes
    from matroot.optim.distributed.rank_part import piece_plan, rank_pieces
    from matroot.optim.distributed.sharding import factor_bytes, shard_plan

    rng = np.random.default_rng(12)
    # Parameters of 3x3 and 2x3 blocks that the cuts fall inside at every world size
    # here (some ranks own a partial stripe of block rows), and a vector left to the
    # elementwise update.
    shapes = [(40, 48), (32, 48), (16, 8), (8,)]
    params = [rng.standard_normal(s) for s in shapes]
    config = ShampooConfig(lr=0.05, block_size=16, precondition_frequency=2, momentum=0.5,
                           root_method="evd", matrix_eps=1e-6)
    plan = core.make_plan(params, config)
    split = shard_plan(plan, world)
    pieces = [rank_pieces(plan, split, r) for r in range(world)]

    def parts(arrays, r):
        return [p.of(arrays[p.param], plan.params[p.param]) for p in pieces[r]]

    single = init(params, config, lazy=True)
    ranks = [init(parts(params, r), config, plan=piece_plan(plan, split, r, pieces[r]),
                  lazy=True) for r in range(world)]
    cut = {p.param for r in range(world) for p in pieces[r] if p.index is not None
           and p.shape != plan.params[p.param].view}
    assert cut, "some parameter must be cut between ranks"
    for _ in range(5):
        grads = [rng.standard_normal(s) for s in shapes]
        expected, single = update(grads, single, params, config)
        # What the all-gather does: every element from the one rank that owns it.
        assembled = [np.full(s, np.nan) for s in shapes]
        for r in range(world):
            updates, ranks[r] = update(parts(grads, r), ranks[r], parts(params, r), config)
            for piece, u in zip(pieces[r], updates):
                piece.of(assembled[piece.param], plan.params[piece.param])[...] = u
        # A rank solves a smaller stack than one process: another batch size, which
        # need not round alike; the updates agree to float64 rounding (κ ≤ λmax/matrix_eps).
        for got, want in zip(assembled, expected):
            assert relative_distance(got, want) <= rounding_tolerance("float64", 1e9, 16)
        params = apply_updates(params, expected)
    # Nothing is kept twice: the ranks' states add up to the single process's.
    per_rank = [state_bytes(state)["total"] for state in ranks]
    assert sum(per_rank) == state_bytes(single)["total"]
    # And they are balanced up to the granularity of the cut: one block (its factors and
    # its three moments, float64) more than a fair share at most.
    block = max(factor_bytes(g) + 3 * 8 * math.prod(g.shape) for g in plan.groups)
    assert max(per_rank) <= state_bytes(single)["total"] / world + block
