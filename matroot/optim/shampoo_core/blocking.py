"""Block partitioning: every parameter shape mapped onto same-size factor stacks.

A parameter is first given a *view*: singleton dimensions are dropped, tensors
of three or more dimensions are reshaped to a matrix by merging dimensions, so
what is left is a matrix ``(rows, cols)``, a vector ``(n,)`` or a scalar ``()``.
Matrices are cut into blocks of at most ``block_size`` rows and columns (the
last block of each direction takes the remainder; ``block_size=math.inf`` keeps
each parameter whole). A :class:`FactorPolicy` says which dimensions of a
parameter get a Kronecker factor: a dimension without one (skipped, or longer
than ``max_preconditioned_dim``) is not cut into blocks, and a matrix with one
preconditioned side is a one-sided block ``L^(-1/2) G`` or ``G R^(-1/2)``.
Blocks of equal shape, from any parameter, form a :class:`BlockGroup` whose gradients
are handled as one ``(k, rows, cols)`` array; each group owns a contiguous run of slots
in the ``(b, n, n)`` factor stacks of its row size (left factors) and column size (right
factors). One stack exists per distinct (size, root, dtype), so one ``inv_root`` call
per stack covers every factor of that size in the model.

The plan is pure metadata (shapes and slot numbers); it holds no arrays and is
the unit a distributed layer can split across ranks (see :func:`subgroup`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .factor_policy import DEFAULT_MAX_FACTOR_RATIO, FactorPolicy, factor_ratio, split_sizes

__all__ = [
    "MATRIX",
    "VECTOR",
    "ELEMENTWISE",
    "Block",
    "FactorPolicy",
    "BlockGroup",
    "FactorStackShape",
    "ParamLayout",
    "BlockPlan",
    "matrix_view_shape",
    "split_sizes",
    "check_block_size",
    "factor_ratio",
    "DEFAULT_MAX_FACTOR_RATIO",
    "plan_blocks",
    "subgroup",
]

#: Parameter kinds: Shampoo with two factors, Shampoo with one factor (root 2),
#: or the elementwise (AdamW) update alone.
MATRIX = "matrix"
VECTOR = "vector"
ELEMENTWISE = "elementwise"

#: Root orders: L^(-1/4) G R^(-1/4) for two-sided blocks; L^(-1/2) g for vector blocks
#: and for one-sided matrix blocks (L^(-1/2) G or G R^(-1/2)), whose single factor then
#: whitens its side as fully as the two factors of a two-sided block do together.
TWO_SIDED_ROOT = 4
ONE_SIDED_ROOT = 2


@dataclass(frozen=True)
class Block:
    """One block of a parameter's view: rows ``[r0, r1)``, columns ``[c0, c1)``.

    ``cols`` is None for a block of a vector view.
    """

    param: int
    rows: tuple[int, int]
    cols: tuple[int, int] | None

    @property
    def index(self) -> tuple[slice, ...]:
        """The block's place in its parameter's view, as an index."""
        if self.cols is None:
            return (slice(*self.rows),)
        return (slice(*self.rows), slice(*self.cols))


@dataclass(frozen=True)
class BlockGroup:
    """Blocks of one shape and dtype, processed as one ``(k, *shape)`` array.

    ``left`` and ``right`` are ``(stack index, first slot)``: the factors of
    ``blocks[j]`` sit in slot ``first + j`` of those stacks. A side without a
    factor is None: ``right`` of vector blocks, one of the two of one-sided
    matrix blocks.
    """

    shape: tuple[int, ...]
    dtype: str
    blocks: tuple[Block, ...]
    left: tuple[int, int] | None
    right: tuple[int, int] | None

    @property
    def factor_slots(self) -> tuple[tuple[int, int], ...]:
        """``(stack, first slot)`` of each side that has a factor, left first."""
        return tuple(side for side in (self.left, self.right) if side is not None)


@dataclass(frozen=True)
class FactorStackShape:
    """A ``(count, size, size)`` stack of factors that share one ``inv_root`` call."""

    size: int
    root: int
    dtype: str
    count: int


@dataclass(frozen=True)
class ParamLayout:
    """How one parameter is treated: its shape, its view, its kind, its factored sides.

    ``sides[d]`` says whether view dimension ``d`` has a factor; a parameter with
    none is ``ELEMENTWISE``.
    """

    shape: tuple[int, ...]
    view: tuple[int, ...]
    kind: str
    sides: tuple[bool, ...] = ()


@dataclass(frozen=True)
class BlockPlan:
    """The partition of a list of parameters into block groups and factor stacks."""

    params: tuple[ParamLayout, ...]
    groups: tuple[BlockGroup, ...]
    stacks: tuple[FactorStackShape, ...]
    block_size: float

    @property
    def num_blocks(self) -> int:
        """Number of preconditioned blocks."""
        return sum(len(g.blocks) for g in self.groups)


def matrix_view_shape(shape) -> tuple[int, ...]:
    """The shape Shampoo works on for a parameter of shape ``shape``.

    Singleton dimensions are dropped. With three or more dimensions left, they
    are merged into a matrix at the split point that makes its two sides the
    most equal (ties go to the earlier split), e.g. a conv kernel
    ``(out, in, kh, kw)`` becomes ``(out, in·kh·kw)`` and ``(kh, kw, in, out)``
    becomes ``(kh·kw·in, out)``.

    Parameters
    ----------
    shape : tuple of int

    Returns
    -------
    tuple of int
        Length 0 (scalar), 1 (vector) or 2 (matrix).

    Examples
    --------
    >>> matrix_view_shape((64, 32, 3, 3))
    (64, 288)
    >>> matrix_view_shape((1, 10, 1))
    (10,)
    """
    dims = [int(d) for d in shape if d != 1]
    if len(dims) <= 2:
        return tuple(dims)
    splits = [(math.prod(dims[:k]), math.prod(dims[k:])) for k in range(1, len(dims))]
    return min(splits, key=lambda rc: abs(math.log(rc[0]) - math.log(rc[1])))


def _ranges(n: int, block_size: float) -> list[tuple[int, int]]:
    out, start = [], 0
    for size in split_sizes(n, block_size):
        out.append((start, start + size))
        start += size
    return out


def _layout(shape, policy: FactorPolicy, block_size: float) -> ParamLayout:
    shape = tuple(int(d) for d in shape)
    if math.prod(shape) == 0:
        return ParamLayout(shape, shape, ELEMENTWISE, (False,) * len(shape))
    view = matrix_view_shape(shape)
    sides = policy.sides(view, block_size)
    if not any(sides):
        return ParamLayout(shape, view, ELEMENTWISE, sides)
    return ParamLayout(shape, view, MATRIX if len(view) == 2 else VECTOR, sides)


def _blocks_of(index: int, layout: ParamLayout, block_size: float) -> list[Block]:
    if layout.kind == ELEMENTWISE:
        return []
    # A dimension without a factor is not cut: its blocks would only shrink the statistics.
    cuts = [_ranges(n, block_size if side else math.inf)
            for n, side in zip(layout.view, layout.sides)]
    if layout.kind == VECTOR:
        return [Block(index, r, None) for r in cuts[0]]
    return [Block(index, r, c) for r in cuts[0] for c in cuts[1]]


def _block_shape(block: Block) -> tuple[int, ...]:
    rows = block.rows[1] - block.rows[0]
    if block.cols is None:
        return (rows,)
    return (rows, block.cols[1] - block.cols[0])


def _policies(policy, count: int) -> list[FactorPolicy]:
    if isinstance(policy, FactorPolicy):
        return [policy] * count
    policies = list(policy)
    if len(policies) != count:
        raise ValueError(f"got {len(policies)} factor policies for {count} parameters")
    return policies


def plan_blocks(shapes, dtypes, *, block_size: float = 1024,
                policy: FactorPolicy | Sequence[FactorPolicy] = FactorPolicy(),
                stacked: bool = True) -> BlockPlan:
    """Partition parameters into block groups and same-size factor stacks.

    Parameters
    ----------
    shapes : sequence of tuple of int
        Parameter shapes.
    dtypes : sequence of str
        The dtype each parameter's factors are kept in ("float32" or "float64").
    block_size : int or math.inf
        Largest block side of a preconditioned dimension.
    policy : FactorPolicy or sequence of FactorPolicy
        Which dimensions get factors: one policy for all parameters, or one each.
    stacked : bool
        True: blocks of equal shape share a group and factors of equal size share
        a stack. False: every block is its own group and every factor its own
        stack of one (the per-block layout of Distributed Shampoo), for
        comparisons.

    Returns
    -------
    BlockPlan

    Raises
    ------
    ValueError
        If ``block_size`` is not a positive integer or ``math.inf``, or the lengths differ.

    Examples
    --------
    >>> plan = plan_blocks([(300, 200), (200,), (64, 3, 3, 3)], ["float32"] * 3,
    ...                    block_size=128)
    >>> [(s.size, s.count) for s in plan.stacks]
    [(27, 1), (44, 2), (64, 1), (72, 3), (128, 7)]
    >>> [p.kind for p in plan.params]
    ['matrix', 'elementwise', 'matrix']
    >>> one_sided = plan_blocks([(50000, 64)], ["float32"], block_size=1024,
    ...                         policy=FactorPolicy(max_preconditioned_dim=4096))
    >>> [(s.size, s.root, s.count) for s in one_sided.stacks]
    [(64, 2, 1)]
    """
    check_block_size(block_size)
    shapes, dtypes = list(shapes), list(dtypes)
    if len(shapes) != len(dtypes):
        raise ValueError(f"got {len(shapes)} shapes but {len(dtypes)} dtypes")
    layouts = tuple(_layout(s, p, block_size)
                    for s, p in zip(shapes, _policies(policy, len(shapes))))

    # Blocks gathered into groups keyed by (dtype, shape), in parameter order.
    keyed: dict[tuple, list[Block]] = {}
    for index, layout in enumerate(layouts):
        for block in _blocks_of(index, layout, block_size):
            key = (dtypes[index], _block_shape(block), layout.sides)
            if stacked:
                keyed.setdefault(key, []).append(block)
            else:
                keyed[(key, len(keyed))] = [block]
    group_keys = sorted(keyed, key=lambda k: k if stacked else k[1])

    # Each group claims a run of slots in the stack of each of its factor sizes.
    stack_counts: dict[tuple, int] = {}
    claims = []
    for gkey in group_keys:
        dtype, shape, factored = gkey if stacked else gkey[0]
        blocks = keyed[gkey]
        root = TWO_SIDED_ROOT if sum(factored) == 2 else ONE_SIDED_ROOT
        sides: list[tuple[tuple, int] | None] = []
        for size, has_factor in zip(shape, factored):
            if not has_factor:
                sides.append(None)
                continue
            skey = (dtype, root, size) if stacked else (dtype, root, size, len(stack_counts))
            first = stack_counts.get(skey, 0)
            stack_counts[skey] = first + len(blocks)
            sides.append((skey, first))
        sides += [None] * (2 - len(sides))
        claims.append((dtype, shape, blocks, sides))

    stack_keys = sorted(stack_counts, key=lambda k: (k[0], k[1], k[2]) + tuple(k[3:]))
    stack_index = {k: i for i, k in enumerate(stack_keys)}
    stacks = tuple(FactorStackShape(size=k[2], root=k[1], dtype=k[0], count=stack_counts[k])
                   for k in stack_keys)
    groups = []
    for dtype, shape, blocks, sides in claims:
        left, right = ((stack_index[side[0]], side[1]) if side is not None else None
                       for side in sides)
        groups.append(BlockGroup(shape, dtype, tuple(blocks), left, right))
    return BlockPlan(layouts, tuple(groups), stacks, block_size)


def check_block_size(block_size) -> float:
    """``block_size`` if it is a positive integer or ``math.inf``, else a ValueError."""
    if block_size == math.inf and isinstance(block_size, float):
        return block_size
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer or math.inf, "
                         f"got {block_size!r}")
    return block_size


def subgroup(group: BlockGroup, start: int, stop: int) -> BlockGroup:
    """The group made of ``group.blocks[start:stop]``, with its slots shifted to match.

    Examples
    --------
    >>> plan = plan_blocks([(8, 8)], ["float32"], block_size=4)
    >>> sub = subgroup(plan.groups[0], 1, 3)
    >>> len(sub.blocks), sub.left, sub.right
    (2, (0, 1), (0, 5))
    """
    if not 0 <= start <= stop <= len(group.blocks):
        raise ValueError(f"bad block range [{start}, {stop}) for a group of "
                         f"{len(group.blocks)} blocks")
    left, right = (None if side is None else (side[0], side[1] + start)
                   for side in (group.left, group.right))
    return replace(group, blocks=group.blocks[start:stop], left=left, right=right)
