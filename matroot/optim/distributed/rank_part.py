"""The part of a Shampoo block plan one rank owns, and the moments it keeps for it.

:func:`~matroot.optim.distributed.sharding.shard_plan` gives each rank a contiguous run of every
group's blocks and some elementwise parameters whole. :func:`local_plan` is that
rank's part with its factor-stack slots renumbered: what its factor stacks hold.

A rank keeps moments (``exp_avg``, ``exp_avg_sq``, the momentum buffer) for exactly
the elements it owns. :func:`rank_pieces` covers them with rectangles of the
parameters' views, *pieces*: a rank's blocks of one parameter are consecutive in
row-major block order, so they make at most three (a partial stripe of block rows,
whole stripes, a partial stripe). :func:`piece_plan` is the plan whose parameters
are those pieces, the plan the rank's functional core runs on. A rank stores one
parameter's moments as a flat vector of its pieces' elements, piece after piece, or
in the parameter's own shape when it owns all of it (:func:`kept_piece` is a piece's
view into either); :func:`own_part` cuts that from whole-parameter moments and
:func:`place_part` writes it back into them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ... import _xp
from ..shampoo_core.blocking import Block, BlockGroup, BlockPlan, FactorStackShape, ParamLayout
from .sharding import ShardPlan

__all__ = ["MOMENT_KEYS", "local_plan", "Piece", "rank_pieces", "piece_plan", "kept_piece",
           "own_part", "place_part"]

#: The per-parameter state entries shaped like the parameter (sharded: like the
#: elements a rank owns of it).
MOMENT_KEYS = ("exp_avg", "exp_avg_sq", "momentum_buffer")


def local_plan(plan: BlockPlan, split: ShardPlan, rank: int) -> tuple[BlockPlan, tuple]:
    """The part of ``plan`` that rank ``rank`` owns, as a plan of its own.

    Groups keep their order and keep only the rank's run of blocks; groups the
    rank owns nothing of are left out. Factor-stack slots are renumbered so that
    the rank's stacks hold its own factors only, in the order of
    :func:`~matroot.optim.shampoo_core.blocking.plan_blocks` (group by group).

    Parameters
    ----------
    plan : BlockPlan
    split : ShardPlan
    rank : int

    Returns
    -------
    local : BlockPlan
    owned : tuple of (int, int, int)
        ``(group in plan, start, stop)`` for each group of ``local``, in order.

    Examples
    --------
    >>> from matroot.optim.shampoo_core.blocking import plan_blocks
    >>> from matroot.optim.distributed.sharding import shard_plan
    >>> plan = plan_blocks([(8, 8), (8, 6)], ["float32"] * 2, block_size=4)
    >>> local, owned = local_plan(plan, shard_plan(plan, 2), 1)
    >>> owned
    ((0, 0, 2), (1, 4, 6))
    >>> [(s.size, s.count) for s in local.stacks]
    [(2, 2), (4, 6)]
    """
    if not 0 <= rank < split.world_size:
        raise ValueError(f"rank {rank} is outside a world of {split.world_size}")
    if len(split.counts) != len(plan.groups):
        raise ValueError(f"the split covers {len(split.counts)} groups but the plan has "
                         f"{len(plan.groups)}")
    stack_counts: dict[int, int] = {}
    claims, owned = [], []
    for g, group in enumerate(plan.groups):
        start, stop = split.ranges(g)[rank]
        if start == stop:
            continue
        firsts: list[tuple[int, int] | None] = []
        for side in (group.left, group.right):
            if side is None:
                firsts.append(None)
                continue
            stack = side[0]
            firsts.append((stack, stack_counts.get(stack, 0)))
            stack_counts[stack] = stack_counts.get(stack, 0) + stop - start
        claims.append((group, start, stop, firsts))
        owned.append((g, start, stop))
    # Keep the global stack order, dropping stacks the rank has no factor in.
    kept = sorted(stack_counts)
    renumber = {old: new for new, old in enumerate(kept)}
    stacks = tuple(FactorStackShape(plan.stacks[s].size, plan.stacks[s].root, plan.stacks[s].dtype,
                             stack_counts[s]) for s in kept)
    groups = []
    for group, start, stop, firsts in claims:
        left, right = (None if first is None else (renumber[first[0]], first[1])
                       for first in firsts)
        groups.append(BlockGroup(group.shape, group.dtype, group.blocks[start:stop],
                                 left, right))
    local = BlockPlan(plan.params, tuple(groups), stacks, plan.block_size)
    return local, tuple(owned)


@dataclass(frozen=True)
class Piece:
    """A rectangle of one parameter's view that one rank owns.

    Attributes
    ----------
    param : int
        The parameter, numbered as in the full plan.
    index : tuple of slice or None
        The rectangle's place in the parameter's view; None for the whole parameter
        (an elementwise one).
    shape : tuple of int
        The rectangle's shape (the parameter's for a whole one).
    offset : int
        Its first element in the rank's flat moments of the parameter.
    """

    param: int
    index: tuple[slice, ...] | None
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def of(self, array, layout: ParamLayout):
        """This piece of a whole-parameter ``array`` (a view where the array library
        makes one: contiguous NumPy and torch arrays)."""
        if self.index is None:
            return array
        return _xp.array_namespace(array).reshape(array, layout.view)[self.index]


def _rectangles(blocks: list[Block]) -> list[tuple[tuple[int, int], tuple[int, int] | None]]:
    """``(rows, cols)`` rectangles covering ``blocks`` (sorted row-major): blocks side by
    side in one stripe of rows join, then stripes of equal columns one above the other."""
    rects: list = []
    for block in blocks:
        if rects and block.cols is not None and rects[-1][0] == block.rows \
                and rects[-1][1][1] == block.cols[0]:
            rects[-1][1] = (rects[-1][1][0], block.cols[1])
        else:
            rects.append([block.rows, block.cols])
    merged: list = []
    for rows, cols in rects:
        if merged and merged[-1][1] == cols and merged[-1][0][1] == rows[0]:
            merged[-1][0] = (merged[-1][0][0], rows[1])
        else:
            merged.append([rows, cols])
    return [(tuple(rows), None if cols is None else tuple(cols)) for rows, cols in merged]


def rank_pieces(plan: BlockPlan, split: ShardPlan, rank: int) -> tuple[Piece, ...]:
    """The pieces rank ``rank`` owns, parameter by parameter (each in row-major order).

    Examples
    --------
    >>> from matroot.optim.shampoo_core.blocking import plan_blocks
    >>> from matroot.optim.distributed.sharding import shard_plan
    >>> plan = plan_blocks([(12, 12), (5,)], ["float32"] * 2, block_size=4)
    >>> split = shard_plan(plan, 2)
    >>> for piece in rank_pieces(plan, split, 1):
    ...     print(piece.param, piece.index, piece.shape, piece.offset)
    0 (slice(4, 8, None), slice(8, 12, None)) (4, 4) 0
    0 (slice(8, 12, None), slice(0, 12, None)) (4, 12) 16
    1 None (5,) 0
    """
    local, _ = local_plan(plan, split, rank)
    by_param: dict[int, list[Block]] = {}
    for group in local.groups:
        for block in group.blocks:
            by_param.setdefault(block.param, []).append(block)
    whole = set(split.elementwise_of(rank))
    pieces = []
    for i, layout in enumerate(plan.params):
        if i in whole:
            pieces.append(Piece(i, None, layout.shape, 0))
            continue
        offset = 0
        blocks = sorted(by_param.get(i, ()), key=lambda b: (b.rows, b.cols or (0, 0)))
        for rows, cols in _rectangles(blocks):
            index = (slice(*rows),) if cols is None else (slice(*rows), slice(*cols))
            shape = tuple(s.stop - s.start for s in index)
            pieces.append(Piece(i, index, shape, offset))
            offset += math.prod(shape)
    return tuple(pieces)


def _moved(block: Block, numbered) -> Block:
    """``block`` in the coordinates of the piece of ``numbered`` (``(number, piece)``
    pairs of its parameter) that holds it."""
    for number, piece in numbered:
        starts = [s.start for s in piece.index]
        stops = [s.stop for s in piece.index]
        spans = [block.rows] + ([] if block.cols is None else [block.cols])
        if all(a <= lo and hi <= b for (lo, hi), a, b in zip(spans, starts, stops)):
            rows = (block.rows[0] - starts[0], block.rows[1] - starts[0])
            cols = None if block.cols is None else (block.cols[0] - starts[1],
                                                    block.cols[1] - starts[1])
            return Block(number, rows, cols)
    raise RuntimeError(f"block {block} lies in none of its rank's pieces")


def piece_plan(plan: BlockPlan, split: ShardPlan, rank: int,
               pieces: tuple[Piece, ...] | None = None) -> BlockPlan:
    """The plan rank ``rank``'s core runs on: one parameter per piece (see
    :func:`rank_pieces`, passed as ``pieces`` when already made), its own blocks in
    the pieces' coordinates and the factor stacks of :func:`local_plan`.

    Examples
    --------
    >>> from matroot.optim.shampoo_core.blocking import plan_blocks
    >>> from matroot.optim.distributed.sharding import shard_plan
    >>> plan = plan_blocks([(12, 12), (5,)], ["float32"] * 2, block_size=4)
    >>> part = piece_plan(plan, shard_plan(plan, 2), 1)
    >>> [(p.shape, p.kind) for p in part.params]
    [((4, 4), 'matrix'), ((4, 12), 'matrix'), ((5,), 'elementwise')]
    >>> [(b.param, b.rows, b.cols) for b in part.groups[0].blocks]
    [(0, (0, 4), (0, 4)), (1, (0, 4), (0, 4)), (1, (0, 4), (4, 8)), (1, (0, 4), (8, 12))]
    """
    local, _ = local_plan(plan, split, rank)
    pieces = rank_pieces(plan, split, rank) if pieces is None else pieces
    layouts: list[ParamLayout] = []
    numbered: dict[int, list[tuple[int, Piece]]] = {}
    for number, piece in enumerate(pieces):
        layout = plan.params[piece.param]
        if piece.index is not None:
            layout = ParamLayout(piece.shape, piece.shape, layout.kind, layout.sides)
            numbered.setdefault(piece.param, []).append((number, piece))
        layouts.append(layout)
    groups = tuple(replace(g, blocks=tuple(_moved(b, numbered[b.param]) for b in g.blocks))
                   for g in local.groups)
    return BlockPlan(tuple(layouts), groups, local.stacks, plan.block_size)


def _whole_shaped(array, layout: ParamLayout) -> bool:
    return math.prod(array.shape) == math.prod(layout.shape)


def kept_piece(kept, piece: Piece, layout: ParamLayout):
    """The view of ``piece`` in the moments a rank keeps of its parameter (flat, or
    whole-shaped when it owns all of it)."""
    if _whole_shaped(kept, layout):
        return piece.of(_xp.array_namespace(kept).reshape(kept, layout.shape), layout)
    xp = _xp.array_namespace(kept)
    return xp.reshape(kept[piece.offset:piece.offset + piece.size], piece.shape)


def own_part(array, pieces, layout: ParamLayout):
    """What a rank keeps of one parameter's moments ``array``: ``array`` itself when
    the rank owns the whole parameter (or ``array`` is kept moments already), else its
    pieces' elements, flat (``pieces``: the rank's pieces of that parameter)."""
    size = sum(piece.size for piece in pieces)
    if size == math.prod(layout.shape) or not _whole_shaped(array, layout):
        return array
    xp = _xp.array_namespace(array)
    return xp.concat([xp.reshape(piece.of(array, layout), (-1,)) for piece in pieces])


def place_part(target, kept, pieces, layout: ParamLayout) -> None:
    """Write the moments a rank keeps of one parameter (flat or whole-shaped, as
    :func:`own_part` makes them, or a whole array right on the rank's pieces) into
    the whole-parameter ``target`` (NumPy or torch), at its pieces' places."""
    for piece in pieces:
        source = kept_piece(kept, piece, layout)
        if piece.index is None:
            target[...] = _xp.array_namespace(target).reshape(source, target.shape)
        else:
            _xp.array_namespace(target).reshape(target, layout.view)[piece.index] = source
