"""The sharding plan of sharded Shampoo, without a process group: which rank owns each
block, each element's moments and each stack slot, the planner's balance, state dicts
sharded and consolidated, and ``matroot plan``'s table."""

from __future__ import annotations

import math
import json

import pytest
import torch.distributed as dist
from sharded_scenarios import OPTIONS, SHAPES, _equal, _params, _set_grads

from matroot.optim import Shampoo
from matroot.optim.shampoo_core.blocking import plan_blocks
from matroot.optim.distributed.core import (
    consolidate_state_dicts,
    resolve_process_group,
    shard_state_dict,
    slot_map,
)
from matroot.cli import main as matroot_main
from matroot.optim.distributed.cluster_sizing import MODELS, parse_shapes, plan_summary
from matroot.optim.distributed.rank_part import local_plan
from matroot.optim.distributed.sharding import (
    COMPUTE_SLACK,
    best_balance,
    group_cost,
    shard_plan,
)


def _plan(shapes=SHAPES, block_size=8, **kw):
    return plan_blocks(shapes, ["float32"] * len(shapes), block_size=block_size, **kw)


def test_planner_balance_on_953m_at_8_ranks():
    summary = plan_summary(MODELS["llama-953m"](), world_sizes=[8, 64, 512])
    blocks = {shape: b["count"] for shape, b in summary["blocks"].items()}
    # 64 attention 2048² (4 blocks), 32 gate/up 5632x2048 (10 + 2 of 512x1024),
    # 16 down 2048x5632 (10 + 2 of 1024x512), embedding and head 32000x2048
    # (62 + 2 of 256x1024): 256 + 320 + 160 + 124 blocks of 1024².
    assert blocks == {(1024, 1024): 860, (512, 1024): 64, (1024, 512): 32, (256, 1024): 4}
    assert summary["elements"] == 953_223_168
    w8, w64, w512 = summary["worlds"]
    assert w8["balance"] <= 1.05
    for w in summary["worlds"]:
        assert w["best_balance"] <= w["balance"] + 1e-12
    # Memory per rank falls with the world size, moments too: a rank keeps those of the
    # elements it owns only, so no parameter's moments stop the fall.
    assert w8["preconditioner"] > w64["preconditioner"] > w512["preconditioner"]
    assert w8["moments"] > w64["moments"] > w512["moments"]
    # Nothing is kept twice and the cut balances memory: at 8 and 64 ranks the largest
    # rank's state is within 1.1/world of one process's (14.3 GiB; measured 1.004/8,
    # 1.049/64).
    single = plan_summary(MODELS["llama-953m"](), world_sizes=[1])["worlds"][0]["total"]
    assert w8["total"] <= 1.1 / 8 * single
    assert w64["total"] <= 1.1 / 64 * single


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8, 40])
@pytest.mark.parametrize("shapes,block_size", [(SHAPES, 8), (SHAPES, 5),
                                               ([(50, 30), (30, 30), (7, 9)], 16)])
def test_split_owns_each_block_once_in_contiguous_balanced_pieces(world, shapes, block_size):
    plan = _plan(shapes, block_size)
    split = shard_plan(plan, world)
    assert split == shard_plan(plan, world), "the split must be the same on every rank"
    for g, group in enumerate(plan.groups):
        assert sum(split.counts[g]) == len(group.blocks)
    total = sum(group_cost(g) * len(g.blocks) for g in plan.groups)
    assert sum(split.costs) == total
    assert split.balance >= best_balance(plan, world) - 1e-12
    # Each rank owns one contiguous piece of the model order (parameter by parameter,
    # each parameter's blocks row by row), so a parameter is cut at most once per rank
    # boundary.
    owner = {}
    for g, group in enumerate(plan.groups):
        for rank, (start, stop) in enumerate(split.ranges(g)):
            for block in group.blocks[start:stop]:
                owner[(block.param, block.rows, block.cols or (0, 0))] = rank
    ranks_in_model_order = [owner[key] for key in sorted(owner)]
    assert ranks_in_model_order == sorted(ranks_in_model_order)
    # Compute stays within COMPUTE_SLACK of the best contiguous cut, which carries less
    # than a fair share plus one block.
    largest_cost = max(group_cost(g) for g in plan.groups)
    assert max(split.costs) < (1 + COMPUTE_SLACK) * (total / world + largest_cost)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("shapes,block_size", [(SHAPES, 8), (SHAPES, 5),
                                               ([(50, 30), (30, 30), (7, 9), (40,)], 16)])
def test_every_element_has_its_moments_on_exactly_one_rank(world, shapes, block_size):
    """The ranks' pieces tile every parameter once; a rank's pieces of a parameter are
    at most three rectangles and hold exactly its blocks' elements, which its piece
    plan's blocks address."""
    import numpy as np

    from matroot.optim.distributed.rank_part import piece_plan, rank_pieces

    plan = _plan(shapes, block_size)
    split = shard_plan(plan, world)
    owners = [np.zeros(layout.view or (1,), dtype=int) for layout in plan.params]
    for rank in range(world):
        pieces = rank_pieces(plan, split, rank)
        local, _ = local_plan(plan, split, rank)
        part = piece_plan(plan, split, rank, pieces)
        for i in range(len(plan.params)):
            mine = [p for p in pieces if p.param == i]
            assert len(mine) <= 3
            assert [p.offset for p in mine] == list(np.cumsum([0] + [p.size for p in mine])[:-1])
        for piece in pieces:
            target = owners[piece.param]
            target[... if piece.index is None else piece.index] += 1
        owned = sum(math.prod(g.shape) * len(g.blocks) for g in local.groups)
        elementwise = sum(math.prod(plan.params[i].shape) for i in split.elementwise_of(rank))
        assert sum(p.size for p in pieces) == owned + elementwise
        for group in part.groups:
            for block in group.blocks:
                view = part.params[block.param].view
                assert all(0 <= a < b <= n for (a, b), n in
                           zip([block.rows] + ([block.cols] if block.cols else []), view))
    for i, counts in enumerate(owners):
        if math.prod(plan.params[i].shape):
            assert (counts == 1).all(), f"parameter {i}: {counts}"


@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("world", [2, 3])
def test_local_plans_cover_every_stack_slot_once(world, stacked):
    plan = _plan(stacked=stacked)
    split = shard_plan(plan, world)
    covered = {s: [0] * spec.count for s, spec in enumerate(plan.stacks)}
    for rank in range(world):
        local, owned = local_plan(plan, split, rank)
        used = [0] * len(local.stacks)
        for ls, lslots, fs, fslots in slot_map(plan, split, rank):
            assert local.stacks[ls].size == plan.stacks[fs].size
            for k in range(fslots.start, fslots.stop):
                covered[fs][k] += 1
            used[ls] += lslots.stop - lslots.start
        assert used == [spec.count for spec in local.stacks]
    assert all(c == [1] * len(c) for c in covered.values())


def test_shard_then_consolidate_gives_back_the_single_process_state_dict():
    params = _params()
    opt = Shampoo(params, distributed=None, **OPTIONS)
    for step in range(4):
        _set_grads(params, step)
        opt.step()
    sd = opt.state_dict()
    back = consolidate_state_dicts([shard_state_dict(sd, 3, r) for r in (2, 0, 1)])
    for name in ("factors", "roots", "root_failures"):
        assert _equal(back["shampoo_families"][0][name], sd["shampoo_families"][0][name])
    with pytest.raises(ValueError, match="each of 3 ranks"):
        consolidate_state_dicts([shard_state_dict(sd, 3, r) for r in (0, 1)])


def test_without_a_process_group_shampoo_runs_unsharded():
    assert not dist.is_initialized()
    assert resolve_process_group("auto") is None
    assert resolve_process_group(None) is None
    opt = Shampoo(_params(), **OPTIONS)
    opt._form_families()
    assert opt._families[0].sharding is None
    with pytest.raises(ValueError, match="distributed must be"):
        Shampoo(_params(), distributed="yes")


def plan_main(argv):
    return matroot_main(["plan", *argv])


def test_planner_command_prints_the_table(capsys):
    assert plan_main(["--model", "llama-953m", "--world-size", "8", "64", "512"]) == 0
    out = capsys.readouterr().out
    assert "1024x1024" in out and "860" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["8"], ["64"],
                                                                                ["512"])]
    assert [row[0] for row in rows] == ["8", "64", "512"]
    assert float(rows[0][2]) <= 1.05


def test_planner_prints_fsdp2_bytes_per_rank(capsys):
    assert plan_main(["--shapes", "11x6,5x10,5", "--block-size", "4", "--world-size", "2",
                      "3", "--fsdp2"]) == 0
    out = capsys.readouterr().out
    assert "FSDP2" in out
    rows = [line.split() for line in out.split("FSDP2")[1].splitlines()
            if line.split()[:1] in (["2"], ["3"])]
    # Rank 0 holds 6 of 11, 3 of 5 and 3 of 5 rows at 2 ranks: (36 + 30 + 3) * 4 bytes.
    assert rows[0][:3] == ["2", "276", "B"]


def test_planner_takes_user_shapes(tmp_path, capsys):
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"w1": [300, 200], "b1": [200], "conv": [16, 3, 3, 3]}))
    assert plan_main(["--shapes-json", str(path), "--block-size", "128", "--world-size",
                      "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["elementwise"]["names"] == ["b1"]
    assert {tuple(b["shape"]): b["count"] for b in data["blocks"]} == {
        (128, 128): 2, (128, 72): 2, (44, 128): 1, (44, 72): 1, (16, 27): 1}
    assert parse_shapes("2048x2048, 5632x2048") == [("0", (2048, 2048)), ("1", (5632, 2048))]
    assert plan_main(["--shapes", "20x12,33", "--block-size", "8", "--world-size", "3"]) == 0


@pytest.mark.parametrize("argv,match", [
    (["--shapes", "4xq"], "not of the form"),
    (["--shapes", "4x-3"], "must be >= 0"),
    (["--world-size", "0"], "positive integers"),
    (["--block-size", "0"], "block_size"),
])
def test_planner_rejects_bad_input(argv, match, capsys):
    assert plan_main(argv) == 2
    assert match in capsys.readouterr().err
