"""Which part of each parameter's Muon/AdamW state each rank keeps: a size-balanced plan.

The state is elementwise (a momentum, AdamW's second moment), so any split of a
parameter works as long as every rank computes its part from the same whole
gradient; only a ``fully_shard`` parameter's is fixed (its gradient arrives as
this rank's rows, so its state is those rows). A split must still be one that
``torch.distributed.checkpoint`` can reshard, so it is a ``DTensor`` placement:

- **chunks** of one dimension over all ranks (``Shard(dim)``, ``torch.chunk``'s
  cut: the first ranks take ``ceil(size/world)``, the last may take none), the
  dimension whose largest chunk is the smallest share
  (:func:`~matroot.optim.distributed.muon_owners.state_dim`); or
- **all of it on one rank** (``Replicate`` on that rank's one-rank mesh).

Chunks always load the first ranks most: ``(3,)`` at 4 ranks is 1, 1, 1, 0, and a
model of many such parameters would leave rank 0 with ``ceil(size/world)/size`` of
it. :func:`plan_state` therefore takes the parameters largest first and gives each
whole to the least-loaded rank where that lowers the largest rank's load, else
chunks it; the fixed rows of ``fully_shard`` parameters are counted first. Every
rank computes the same plan from the shapes alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .muon_owners import row_ranges, state_dim

__all__ = ["StatePart", "plan_state"]


@dataclass(frozen=True)
class StatePart:
    """One parameter's state split: per rank, the chunk ``ranges[rank]`` of dimension
    ``dim``; ``holder`` is the one rank that keeps all of it (else None)."""

    dim: int
    ranges: tuple[tuple[int, int], ...]
    holder: int | None = None

    def shape(self, shape, rank: int) -> tuple[int, ...]:
        """The shape of ``rank``'s part of a parameter of ``shape``."""
        start, stop = self.ranges[rank]
        return tuple(stop - start if d == self.dim else n for d, n in enumerate(shape))


def _chunked(shape, dim: int, world: int) -> StatePart:
    return StatePart(dim, tuple(row_ranges(shape[dim], world)))


def _held(shape, holder: int, world: int) -> StatePart:
    size = shape[0]
    return StatePart(0, tuple((0, size) if r == holder else (0, 0) for r in range(world)),
                     holder)


def plan_state(shapes, muon, fixed, weights, world: int, hold: bool = True) -> list:
    """Each parameter's :class:`StatePart` (None for a 0-d one, which every rank keeps).

    Parameters
    ----------
    shapes : sequence of tuple of int
    muon : sequence of bool
        Whether each parameter is Muon's (its chunks must be rectangles of its
        matrices: rows or columns) or AdamW's (any dimension).
    fixed : sequence of bool
        Whether its state must be its rows (a ``fully_shard`` parameter).
    weights : sequence of int
        Its state's bytes per element (``itemsize`` × the number of state tensors).
    world : int
    hold : bool
        Whether a parameter may be kept whole by one rank (False: chunks only).

    Returns
    -------
    list of StatePart or None

    Examples
    --------
    >>> from matroot.optim.distributed.muon_layout import plan_state
    >>> parts = plan_state([(3, 512)] + [(5,)] * 6, [True] + [False] * 6, [False] * 7,
    ...                    [4] + [8] * 6, 4)
    >>> parts[0].ranges         # the matrix by columns, not 1, 1, 1, 0 rows
    ((0, 128), (128, 256), (256, 384), (384, 512))
    >>> [(p.dim, p.holder) for p in parts[1:]]     # two vectors whole, where they even out
    [(0, None), (0, None), (0, 3), (0, None), (0, None), (0, 2)]
    """
    loads = [0] * world
    parts: list = [None] * len(shapes)

    def add(part: StatePart, shape, weight: int, into: list) -> list:
        return [load + weight * math.prod(part.shape(shape, r)) for r, load in enumerate(into)]

    for i, shape in enumerate(shapes):
        if fixed[i] and len(shape):
            parts[i] = _chunked(shape, 0, world)
            loads = add(parts[i], shape, weights[i], loads)
    free = [i for i, shape in enumerate(shapes) if not fixed[i] and len(shape)]
    for i in sorted(free, key=lambda i: (-weights[i] * math.prod(shapes[i]), i)):
        shape = shapes[i]
        chunked = _chunked(shape, state_dim(shape, world, bool(muon[i])), world)
        spread = add(chunked, shape, weights[i], loads)
        held = _held(shape, min(range(world), key=lambda r: (loads[r], r)), world)
        lump = add(held, shape, weights[i], loads)
        better = hold and max(lump) < max(spread)
        parts[i], loads = (held, lump) if better else (chunked, spread)
    return parts
