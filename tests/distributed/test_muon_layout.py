"""The size-balanced split of Muon's state over ranks (``muon_layout.plan_state``) and
the owners' rectangles it implies, checked as metadata in this process (the spawned
ranks of ``test_muon_distributed.py`` run it)."""

from __future__ import annotations

import math

import pytest

from matroot.optim.distributed.muon_layout import plan_state
from matroot.optim.distributed.muon_owners import MatrixOwners, row_ranges

#: Issue 37's target: a rank keeps at most 1.1/world of one process's state.
SHARE = 1.1

NET = [((12, 8), False), ((24, 8), True), ((24,), False), ((10, 24), True), ((10,), False),
       ((6, 8, 8), True), ((6, 10), False), ((6,), False), ((12, 6), True), ((6, 12), True)]
SMALL = [((3, 512), True), ((5, 64), True), ((3, 8, 8), True), ((2, 3), True),
         ((3,), False), ((5,), False), ((7,), False)]
BIASES = [((5,), False)] * 40


def _largest_share(model, world, fixed=None, hold=True) -> float:
    shapes = [s for s, _ in model]
    muon = [m for _, m in model]
    fixed = fixed or [False] * len(model)
    weights = [4 * (1 if m else 2) for m in muon]      # float32; AdamW keeps two tensors
    parts = plan_state(shapes, muon, fixed, weights, world, hold)
    loads = [sum(w * math.prod(p.shape(s, r)) for p, s, w in zip(parts, shapes, weights))
             for r in range(world)]
    for p, s in zip(parts, shapes):       # every element kept by exactly one rank
        assert sum(math.prod(p.shape(s, r)) for r in range(world)) == math.prod(s)
    return max(loads) / sum(w * math.prod(s) for s, w in zip(shapes, weights))


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("model", [NET, SMALL, BIASES, [((3, 512), True)], [((5, 64), True)]],
                         ids=["net", "small", "biases", "3x512", "5x64"])
def test_every_rank_keeps_at_most_a_world_share(model, world):
    assert _largest_share(model, world) <= SHARE / world


def test_chunks_alone_load_the_first_rank():
    """What the plan fixes: cut by rows, rank 0 keeps ceil(rows/world)/rows of each."""
    assert _largest_share(BIASES, 4, hold=False) == pytest.approx(2 / 5)
    assert _largest_share([((3, 512), True)], 4, fixed=[True]) == pytest.approx(1 / 3)


def test_fsdp2_rows_are_kept_and_evened_out_by_the_whole_parameters():
    """A ``fully_shard`` parameter's state is its rows (2 of 3 on rank 0 at 2 ranks);
    the whole parameters go to the other rank until the loads even out."""
    model = [((3, 512), True), *SMALL]
    fixed = [True] + [False] * len(SMALL)
    parts = plan_state([s for s, _ in model], [m for _, m in model], fixed,
                       [4 if m else 8 for _, m in model], 2)
    assert parts[0].ranges == tuple(row_ranges(3, 2)) and parts[0].holder is None
    assert _largest_share(model, 2, fixed) <= SHARE / 2


@pytest.mark.parametrize("world", [2, 3, 4])
def test_owners_see_every_element_of_every_matrix_once(world):
    """Rows, columns and whole parameters: the rectangles the ranks hold of each matrix
    cover it exactly."""
    shapes = [s for s, m in SMALL if m] + [(6, 8, 8), (16, 2, 3, 3), (12, 6)]
    splits = [1] * (len(shapes) - 1) + [3]
    parts = plan_state(shapes, [True] * len(shapes), [False] * len(shapes),
                       [4] * len(shapes), world)
    owners = MatrixOwners(shapes, ["float32"] * len(shapes), splits, world, 0,
                          [p.dim for p in parts], [p.ranges for p in parts])
    assert {p.dim for p in parts} != {0}       # some parts are columns
    for m in owners.matrices:
        held = sum(owners._elements(m, r) for r in range(world))
        assert held == (m.rows[1] - m.rows[0]) * m.cols, m
