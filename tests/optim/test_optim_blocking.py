"""Block plan: views, ragged blocks, and the slot layout of the factor stacks."""

import math

import numpy as np
import pytest

from matroot.optim.shampoo_core.blocking import (
    ELEMENTWISE,
    FactorPolicy,
    MATRIX,
    VECTOR,
    matrix_view_shape,
    plan_blocks,
    split_sizes,
    subgroup,
)

SHAPES = [(), (7,), (1, 9, 1), (300, 200), (130, 64), (64, 130), (16, 3, 5, 5), (3, 3, 24, 40),
          (1000, 16), (64, 64), (0, 5)]


@pytest.mark.parametrize("shape, view", [
    ((), ()), ((5,), (5,)), ((1, 5), (5,)), ((1, 1), ()), ((4, 6), (4, 6)),
    ((64, 32, 3, 3), (64, 288)), ((3, 3, 32, 64), (288, 64)), ((1, 8, 1, 9), (8, 9)),
    ((2, 3, 4), (6, 4)), ((10, 2, 2, 2, 2), (10, 16)),
])
def test_matrix_view_shape(shape, view):
    assert matrix_view_shape(shape) == view


@pytest.mark.parametrize("n, block", [(1, 4), (4, 4), (5, 4), (1000, 384), (7, 100)])
def test_split_sizes_cover_without_divisibility(n, block):
    sizes = split_sizes(n, block)
    assert sum(sizes) == n
    assert all(0 < s <= block for s in sizes)
    assert sizes[:-1] == [block] * (len(sizes) - 1)


def _coverage(plan):
    cover = {}
    for i, layout in enumerate(plan.params):
        if layout.kind != ELEMENTWISE:
            cover[i] = np.zeros(layout.view, dtype=int)
    for group in plan.groups:
        for b in group.blocks:
            index = (slice(*b.rows),) if b.cols is None else (slice(*b.rows), slice(*b.cols))
            cover[b.param][index] += 1
            assert tuple(cover[b.param][index].shape) == group.shape
    return cover


@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("block_size", [16, 64, 1024])
def test_blocks_tile_every_preconditioned_parameter_once(stacked, block_size):
    plan = plan_blocks(SHAPES, ["float32"] * len(SHAPES), block_size=block_size,
                       policy=FactorPolicy(precondition_1d=True), stacked=stacked)
    kinds = [p.kind for p in plan.params]
    assert kinds[0] == ELEMENTWISE and kinds[1] == VECTOR and kinds[2] == VECTOR
    assert kinds[-1] == ELEMENTWISE
    assert kinds[3:10] == [MATRIX] * 7
    for cover in _coverage(plan).values():
        assert np.all(cover == 1)
    for group in plan.groups:
        assert all(0 < s <= block_size for s in group.shape)


@pytest.mark.parametrize("stacked", [True, False])
def test_every_stack_slot_is_claimed_by_exactly_one_factor(stacked):
    dtypes = ["float32", "float64"] * 5 + ["float32"]
    plan = plan_blocks(SHAPES, dtypes, block_size=32, policy=FactorPolicy(precondition_1d=True),
                       stacked=stacked)
    claimed = [np.zeros(s.count, dtype=int) for s in plan.stacks]
    for group in plan.groups:
        k = len(group.blocks)
        sides = [(group.left, group.shape[0])]
        if group.right is not None:
            sides.append((group.right, group.shape[1]))
        for (stack, first), size in sides:
            spec = plan.stacks[stack]
            assert spec.size == size and spec.dtype == group.dtype
            assert spec.root == (4 if group.right is not None else 2)
            claimed[stack][first:first + k] += 1
    assert all(np.all(c == 1) for c in claimed)


def test_stacks_are_one_per_distinct_size_root_and_dtype():
    plan = plan_blocks(SHAPES, ["float32"] * len(SHAPES), block_size=64,
                       policy=FactorPolicy(precondition_1d=True))
    keys = [(s.size, s.root, s.dtype) for s in plan.stacks]
    assert len(keys) == len(set(keys))
    sizes = {(n, 4) for g in plan.groups if g.right is not None for n in g.shape}
    sizes |= {(g.shape[0], 2) for g in plan.groups if g.right is None}
    assert {(k[0], k[1]) for k in keys} == sizes
    factors = sum(len(g.blocks) * (2 if g.right is not None else 1) for g in plan.groups)
    assert sum(s.count for s in plan.stacks) == factors
    assert len(plan.stacks) < factors


def test_unstacked_plan_has_a_stack_per_factor_and_the_same_blocks():
    stacked = plan_blocks(SHAPES, ["float32"] * len(SHAPES), block_size=64)
    single = plan_blocks(SHAPES, ["float32"] * len(SHAPES), block_size=64, stacked=False)
    assert all(s.count == 1 for s in single.stacks)
    assert all(len(g.blocks) == 1 for g in single.groups)
    blocks = sorted((b.param, b.rows, b.cols) for g in stacked.groups for b in g.blocks)
    assert blocks == sorted((b.param, b.rows, b.cols) for g in single.groups for b in g.blocks)
    assert stacked.num_blocks == single.num_blocks == len(blocks)


def test_default_plan_leaves_vectors_and_scalars_to_the_elementwise_update():
    plan = plan_blocks([(), (5,), (3, 4)], ["float32"] * 3)
    assert [p.kind for p in plan.params] == [ELEMENTWISE, ELEMENTWISE, MATRIX]
    assert [(s.size, s.count) for s in plan.stacks] == [(3, 1), (4, 1)]


def test_subgroup_shifts_slots():
    plan = plan_blocks([(40, 40)], ["float32"], block_size=10)
    group = plan.groups[0]
    sub = subgroup(group, 5, 9)
    assert sub.blocks == group.blocks[5:9]
    assert sub.left == (group.left[0], group.left[1] + 5)
    assert sub.right == (group.right[0], group.right[1] + 5)
    with pytest.raises(ValueError, match="block range"):
        subgroup(group, 3, 17)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, None])
def test_bad_block_size_is_rejected(bad):
    with pytest.raises(ValueError, match="block_size"):
        plan_blocks([(4, 4)], ["float32"], block_size=bad)


def test_block_count_of_a_ragged_matrix():
    plan = plan_blocks([(1000, 300)], ["float32"], block_size=256)
    assert plan.num_blocks == math.ceil(1000 / 256) * math.ceil(300 / 256)
    assert sorted(g.shape for g in plan.groups) == [(232, 44), (232, 256), (256, 44), (256, 256)]
