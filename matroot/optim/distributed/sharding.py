"""Which rank owns which Shampoo block: a balanced, contiguous split of a :class:`BlockPlan`.

Pure metadata, no arrays and no torch: the same code sizes a cluster in
``python -m matroot plan`` and shards the optimizer in
:mod:`matroot.optim.distributed.core`.

Every rank owns one contiguous piece of the model: the blocks in model order
(parameter by parameter, each parameter's blocks row by row) are cut into
``world_size`` runs balancing compute and memory (:func:`shard_plan`), and each
elementwise (unpreconditioned) parameter is owned whole by one rank. A rank keeps
moments for exactly the elements of what it owns (:mod:`matroot.optim.owned_pieces`),
so per-rank memory is close to 1/world of one process's. Restricted to one group, model order
is the group's block order, so each rank still owns a contiguous run of every
group's blocks (rank 0 first) and a split is stored as counts per group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..shampoo_core.blocking import ELEMENTWISE, BlockGroup, BlockPlan

__all__ = [
    "COMPUTE_SLACK",
    "moment_bytes",
    "block_cost",
    "group_cost",
    "factor_bytes",
    "best_balance",
    "ShardPlan",
    "shard_plan",
    "GatherBucket",
    "gather_buckets",
    "DTYPE_BYTES",
]

#: Bytes per element of the dtypes factors and updates are kept in.
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def block_cost(shape, factored=None) -> int:
    """Work of one block per optimizer step, in multiply-adds.

    An ``r×c`` block costs ``r³ + c³`` for the inverse roots of its two factors
    (every solver is a fixed multiple of one n×n matmul per factor; the
    multiple is the same for all blocks, so it drops out of the balance) plus
    ``r·c·(r + c)`` for its factor update ``GGᵀ``, ``GᵀG``. A side without a factor
    (``factored``, per dimension; default all) costs nothing: a one-sided block with
    a left factor costs ``r³ + r²c``. A vector block of length n costs ``n³ + n²``
    (one root, one outer product).

    Examples
    --------
    >>> block_cost((1024, 1024)) == 4 * 1024 ** 3
    True
    >>> block_cost((8,)), block_cost((10, 160), (True, False))
    (576, 17000)
    """
    factored = (True,) * len(shape) if factored is None else factored
    cost = 0
    for n, has_factor in zip(shape, factored):
        if has_factor:
            cost += n ** 3 + n * math.prod(shape)
    return cost


def group_cost(group: BlockGroup) -> int:
    """:func:`block_cost` of one block of ``group``, with the group's factored sides."""
    sides = (group.left is not None, group.right is not None)[:len(group.shape)]
    return block_cost(group.shape, sides)


def factor_bytes(group: BlockGroup, *, packed: bool = False, root_dtype: str | None = None,
                 keep_roots: bool = True) -> int:
    """State bytes of one block's factors: factor, inverse root, failure counter and
    carried λmax bound (two numbers, :mod:`matroot.optim.shampoo_core.factor_bounds`) each.

    ``packed``, ``root_dtype`` and ``keep_roots`` are the optimizer's
    ``symmetric_packing``, ``root_storage_dtype`` and ``keep_roots``.

    Examples
    --------
    >>> from matroot.optim.shampoo_core.blocking import plan_blocks
    >>> group, = plan_blocks([(8, 4)], ["float32"], block_size=8).groups
    >>> factor_bytes(group), factor_bytes(group, packed=True, keep_roots=False)
    (664, 208)
    """
    sizes = [n for n, side in zip(group.shape, (group.left, group.right)) if side is not None]
    per_entry = DTYPE_BYTES[group.dtype] + (DTYPE_BYTES[root_dtype or group.dtype]
                                            if keep_roots else 0)
    return sum((n * (n + 1) // 2 if packed else n * n) * per_entry + 4
               + 2 * DTYPE_BYTES[group.dtype] for n in sizes)


@dataclass(frozen=True)
class ShardPlan:
    """How many blocks of each group of a :class:`BlockPlan` each rank owns.

    Attributes
    ----------
    world_size : int
    counts : tuple of tuple of int
        ``counts[g][r]``: blocks of ``plan.groups[g]`` owned by rank ``r``. Rank
        ``r`` owns the contiguous run ``ranges(g)[r]`` of the group's blocks.
    costs : tuple of int
        Per-rank total :func:`block_cost`.
    elementwise : tuple of (int, int)
        ``(parameter, rank)``: the owner of each elementwise parameter (empty in
        splits saved before elementwise parameters had one owner).
    """

    world_size: int
    counts: tuple[tuple[int, ...], ...]
    costs: tuple[int, ...]
    elementwise: tuple[tuple[int, int], ...] = ()

    def elementwise_of(self, rank: int) -> tuple[int, ...]:
        """The elementwise parameters ``rank`` owns."""
        return tuple(param for param, owner in self.elementwise if owner == rank)

    def ranges(self, group: int) -> list[tuple[int, int]]:
        """``(start, stop)`` of the blocks of ``group`` owned by each rank."""
        out, start = [], 0
        for count in self.counts[group]:
            out.append((start, start + count))
            start += count
        return out

    def padded_count(self, group: int) -> int:
        """Blocks every rank sends in the all-gather of ``group`` (the largest count)."""
        return max(self.counts[group])

    @property
    def balance(self) -> float:
        """Largest per-rank cost over the mean per-rank cost (1.0 is perfect)."""
        mean = sum(self.costs) / self.world_size
        return max(self.costs) / mean if mean > 0 else 1.0

    def to_dict(self) -> dict:
        """Plain-Python form, for a state dict."""
        return {"world_size": self.world_size,
                "counts": [list(c) for c in self.counts],
                "costs": list(self.costs),
                "elementwise": [list(pair) for pair in self.elementwise]}

    @classmethod
    def from_dict(cls, data) -> ShardPlan:
        """Inverse of :meth:`to_dict`."""
        return cls(int(data["world_size"]),
                   tuple(tuple(int(n) for n in c) for c in data["counts"]),
                   tuple(int(c) for c in data["costs"]),
                   tuple((int(p), int(r)) for p, r in data.get("elementwise", ())))


def best_balance(plan: BlockPlan, world_size: int) -> float:
    """A lower bound on :attr:`ShardPlan.balance` for any split of ``plan``.

    No split beats the mean; and of the ``m`` costliest blocks some rank holds
    at least ``ceil(m / world_size)``, each costing at least the ``m``-th
    largest cost ``c_m``, so the largest rank carries ``max_m ceil(m/W)·c_m``.

    Examples
    --------
    >>> from matroot.optim.shampoo_core.blocking import plan_blocks
    >>> plan = plan_blocks([(12, 4)], ["float32"], block_size=4)
    >>> best_balance(plan, 2)  # 3 equal blocks on 2 ranks: 2 against a mean of 1.5
    1.3333333333333333
    """
    costs = sorted((group_cost(g) for g in plan.groups for _ in g.blocks), reverse=True)
    if not costs:
        return 1.0
    mean = sum(costs) / world_size
    bound = max(-(-m // world_size) * c for m, c in enumerate(costs, start=1))
    return max(bound, mean) / mean


def _model_order(plan: BlockPlan) -> list[tuple[int, int]]:
    """``(group, parameter)`` of every block of ``plan``, blocks in model order."""
    keyed = sorted(((block.param, block.rows, block.cols or (0, 0)), g)
                   for g, group in enumerate(plan.groups) for block in group.blocks)
    return [(g, key[0]) for key, g in keyed]


#: Bisection steps of the cut's bounds: far below any block's share of the loads.
_BISECTIONS = 60
#: How much compute balance the cut gives up for memory: the largest rank's compute
#: stays within this fraction of the best contiguous cut's.
COMPUTE_SLACK = 0.05


def _runs(blocks, cost_bound: float, memory_bound: float) -> list[int]:
    """The run of each block when a run is closed before one of its loads would exceed
    its bound. ``blocks``: per block, its compute share and its memory share."""
    run, cost, memory = 0, 0.0, 0.0
    out: list[int] = []
    for cost_share, memory_share in blocks:
        if out and (cost + cost_share > cost_bound or memory + memory_share > memory_bound):
            run, cost, memory = run + 1, 0.0, 0.0
        cost, memory = cost + cost_share, memory + memory_share
        out.append(run)
    return out


def _smallest_bound(fits, world_size: int) -> float:
    """The smallest bound ``fits`` accepts, by bisection (``fits`` is monotone)."""
    # One run holding everything (loads of world_size, up to rounding) fits below high.
    low, high = 0.0, 2.0 * world_size
    for _ in range(_BISECTIONS):
        bound = (low + high) / 2
        if fits(bound):
            high = bound
        else:
            low = bound
    return high


def moment_bytes(elements: int, dtype: str) -> int:
    """Bytes of the two moments (Adam grafting) of ``elements`` entries in ``dtype``."""
    return 2 * elements * DTYPE_BYTES[dtype]


def _elementwise_owners(plan: BlockPlan, memory: list[float]) -> tuple[tuple[int, int], ...]:
    """An owner for each elementwise parameter: largest first, to the rank with the least
    memory so far (``memory`` per rank, advanced). Their moments are weighed in the
    dtype of the plan's blocks (float32 without any), as the plan keeps no other."""
    dtype = plan.groups[0].dtype if plan.groups else "float32"
    params = [i for i, layout in enumerate(plan.params) if layout.kind == ELEMENTWISE]
    owners = []
    for i in sorted(params, key=lambda i: (-math.prod(plan.params[i].shape), i)):
        rank = min(range(len(memory)), key=lambda r: (memory[r], r))
        memory[rank] += moment_bytes(math.prod(plan.params[i].shape), dtype)
        owners.append((i, rank))
    return tuple(sorted(owners))


def shard_plan(plan: BlockPlan, world_size: int, costs=None) -> ShardPlan:
    """Cut the blocks of ``plan``, in model order, into ``world_size`` balanced runs, and
    give each elementwise parameter one owner.

    A run has two loads, each a share of the single-process total times
    ``world_size`` (1.0 is a fair share): compute, the sum of its blocks'
    :func:`block_cost`, and memory, its blocks' :func:`factor_bytes` plus the two
    moments of their elements (a rank keeps moments for the elements it owns only).
    The cut first finds the smallest largest compute load of any contiguous cut,
    then, allowing :data:`COMPUTE_SLACK` more compute, the smallest largest memory
    load: each a bisection on a bound whose trials are greedy fills, optimal because
    a part of a run never loads more than the run. The elementwise parameters (no
    compute to speak of) then go, largest first, to the rank with the least memory.
    Deterministic: every rank computes the same split from the same plan. The greedy
    fill leaves the last ranks light, or empty when blocks are few.

    Parameters
    ----------
    plan : BlockPlan
    world_size : int
    costs : sequence of int, optional
        One block's compute per group, in place of :func:`group_cost` (Muon's
        groups have no factors: :mod:`matroot.optim.distributed.muon_owners`).

    Returns
    -------
    ShardPlan

    Raises
    ------
    ValueError
        If ``world_size`` is not a positive integer.

    Examples
    --------
    >>> from matroot.optim.shampoo_core.blocking import plan_blocks
    >>> plan = plan_blocks([(8, 8), (8, 6), (5,)], ["float32"] * 3, block_size=4)
    >>> [(g.shape, len(g.blocks)) for g in plan.groups]
    [((4, 2), 2), ((4, 4), 6)]
    >>> split = shard_plan(plan, 2)
    >>> split.counts, split.costs  # rank 0 the 8×8 parameter, rank 1 the 8×6 one
    (((0, 2), (4, 2)), (1024, 752))
    >>> split.elementwise  # the vector's owner: rank 1, the one with less memory
    ((2, 1),)
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    unit = [group_cost(g) for g in plan.groups] if costs is None else list(costs)
    held = [factor_bytes(g) + moment_bytes(math.prod(g.shape), g.dtype) for g in plan.groups]
    order = _model_order(plan)
    counts = [[0] * world_size for _ in plan.groups]
    loads = [0] * world_size
    memory = [0.0] * world_size
    if order:
        total_cost = sum(unit[g] for g, _ in order)
        total_bytes = sum(held[g] for g, _ in order)
        blocks = [(unit[g] * world_size / total_cost, held[g] * world_size / total_bytes)
                  for g, _ in order]

        def fits(cost_bound, memory_bound):
            return _runs(blocks, cost_bound, memory_bound)[-1] < world_size

        cost_bound = (1 + COMPUTE_SLACK) * _smallest_bound(lambda b: fits(b, math.inf),
                                                           world_size)
        memory_bound = _smallest_bound(lambda b: fits(cost_bound, b), world_size)
        for (g, _), rank in zip(order, _runs(blocks, cost_bound, memory_bound)):
            counts[g][rank] += 1
            loads[rank] += unit[g]
            memory[rank] += held[g]
    return ShardPlan(world_size, tuple(tuple(c) for c in counts), tuple(loads),
                     _elementwise_owners(plan, memory))


@dataclass(frozen=True)
class GatherBucket:
    """One all-gather of a step: the updates of every block, and of every elementwise
    parameter, of one dtype, flattened.

    Attributes
    ----------
    dtype : str
    groups : tuple of int
        Indices into ``plan.groups``, in the order their blocks are packed.
    elementwise : tuple of int
        The elementwise parameters in the bucket, packed after the blocks by their owner.
    per_rank : tuple of int
        Elements of the bucket each rank owns.
    """

    dtype: str
    groups: tuple[int, ...]
    elementwise: tuple[int, ...]
    per_rank: tuple[int, ...]

    @property
    def elements(self) -> int:
        """Elements of all blocks and parameters in the bucket."""
        return sum(self.per_rank)

    @property
    def padded(self) -> int:
        """Elements every rank sends: the largest rank's count."""
        return max(self.per_rank)


def gather_buckets(plan: BlockPlan, split: ShardPlan, dtypes) -> list[GatherBucket]:
    """The all-gathers that share one step's updates: one per dtype.

    Every rank packs the updates of the blocks it owns (group by group, each
    group's run in block order), then those of its elementwise parameters, into one
    flat buffer, zero-padded to :attr:`GatherBucket.padded` elements, so every rank
    sends the same number of elements. Ranks own balanced pieces of the model, so the
    padding is small whatever mix of block shapes each rank holds.

    Parameters
    ----------
    plan : BlockPlan
    split : ShardPlan
    dtypes : sequence of str
        Each parameter's update dtype (that of its moments): the plan records it for
        blocks only.

    Examples
    --------
    >>> from matroot.optim.shampoo_core.blocking import plan_blocks
    >>> plan = plan_blocks([(8, 8), (8, 6), (5,)], ["float32"] * 3, block_size=4)
    >>> buckets = gather_buckets(plan, shard_plan(plan, 4), ["float32"] * 3)
    >>> [(b.dtype, b.groups, b.elementwise, b.per_rank, b.padded) for b in buckets]
    [('float32', (0, 1), (2,), (32, 32, 29, 24), 32)]
    """
    keyed: dict[str, tuple[list[int], list[int]]] = {}
    for g, group in enumerate(plan.groups):
        keyed.setdefault(group.dtype, ([], []))[0].append(g)
    owner = dict(split.elementwise)
    for i in sorted(owner):
        keyed.setdefault(dtypes[i], ([], []))[1].append(i)

    def owned(groups, params, r):
        return sum(split.counts[g][r] * math.prod(plan.groups[g].shape) for g in groups) + \
            sum(math.prod(plan.params[i].shape) for i in params if owner[i] == r)

    return [GatherBucket(dtype, tuple(groups), tuple(params),
                         tuple(owned(groups, params, r) for r in range(split.world_size)))
            for dtype, (groups, params) in sorted(keyed.items())]
