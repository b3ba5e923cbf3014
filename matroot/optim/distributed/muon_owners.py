"""Muon's matrices split over ``torch.distributed`` ranks: one owner per matrix, rows elsewhere.

Muon's update of a matrix is its momentum's polar factor, which needs the whole
matrix; everything else Muon and AdamW do is elementwise. So a rank keeps the
state of its **part** of every parameter, ``torch.chunk`` of one dimension (the
first for ``fully_shard``'s parameters, whose gradients come in those rows;
:func:`state_dim` otherwise), and each matrix has one **owner** that
orthogonalizes it whole:

1. every rank updates the momentum of its part and forms its part of the polar
   input ``U`` (elementwise);
2. one ``all_to_all`` per dtype sends every matrix's parts to its owner
   (:meth:`MatrixOwners.to_owners`);
3. each owner stacks its matrices per shape, one :func:`matroot.polar_info` call
   per shape (:func:`~matroot.optim.muon.core.orthogonalized`);
4. one ``all_to_all`` per dtype sends every rank its part of the factors
   (:meth:`MatrixOwners.from_owners`).

A part is a rectangle of every matrix of the parameter's ``(count·m, n)`` view: its
rows (dimension 0) or its columns (the first dimension of the view's columns: 1 of
a 2-D or ≥ 4-D parameter, 2 of a 3-D one).

Which rank owns which matrix is Shampoo's split
(:func:`~matroot.optim.distributed.sharding.shard_plan`): the matrices are the
blocks of a :class:`~matroot.optim.shampoo_core.blocking.BlockPlan` without
factors (a parameter ``(e, m, n)``, or one cut by ``split``, is a run of blocks
of its ``(e·m, n)`` view), weighed by the products of a polar step, ``m·n·min(m, n)``.
Pure metadata here apart from the two exchanges; every rank computes the same plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..muon.core import matrix_stack_shape
from ..shampoo_core.blocking import MATRIX, Block, BlockGroup, BlockPlan, ParamLayout
from .sharding import shard_plan

__all__ = ["row_ranges", "state_dim", "column_dim", "MatrixOwners", "OwnedMatrix"]


def row_ranges(rows: int, world: int) -> list[tuple[int, int]]:
    """Each rank's rows ``[start, stop)`` of a first dimension of ``rows``, as
    ``torch.chunk`` cuts it (and so ``fully_shard`` and ``Shard(0)``): ranks past the
    last chunk get none.

    Examples
    --------
    >>> from matroot.optim.distributed.muon_owners import row_ranges
    >>> row_ranges(11, 3), row_ranges(4, 3)
    ([(0, 4), (4, 8), (8, 11)], [(0, 2), (2, 4), (4, 4)])
    """
    size = -(-rows // world) if rows else 0
    return [(min(r * size, rows), min((r + 1) * size, rows)) for r in range(world)]


def column_dim(shape) -> int:
    """The dimension of a Muon parameter of ``shape`` whose chunks are column ranges of
    its ``(count·m, n)`` view (:func:`~matroot.optim.muon.core.matrix_stack_shape`)."""
    return 2 if len(shape) == 3 else 1


def state_dim(shape, world: int, muon: bool) -> int:
    """The dimension along which the ranks split a whole parameter's state: the one
    whose ``torch.chunk`` over ``world`` ranks gives the largest part the smallest
    share, the first on a tie. A Muon parameter's part must be a rectangle of every
    matrix (dimension 0 or :func:`column_dim`); AdamW's may be any dimension.

    Examples
    --------
    >>> from matroot.optim.distributed.muon_owners import state_dim
    >>> state_dim((24, 8), 4, True), state_dim((3, 512), 4, True), state_dim((6, 8, 8), 4, True)
    (0, 1, 2)
    >>> state_dim((6, 10, 3), 4, False), state_dim((7,), 4, False)
    (1, 0)
    """
    if len(shape) == 0:
        return 0
    dims = ((0, column_dim(shape)) if muon and len(shape) >= 2 else range(len(shape)))

    def largest_share(d: int) -> float:
        size = shape[d]
        return (-(-size // world)) / size if size else 1.0

    return min(dims, key=lambda d: (largest_share(d), d))


@dataclass(frozen=True)
class OwnedMatrix:
    """One matrix: parameter ``param`` (numbered among the Muon parameters), rows
    ``rows`` of its ``(count·m, n)`` view, owned by rank ``owner``."""

    param: int
    rows: tuple[int, int]
    cols: int
    dtype: str
    owner: int


class MatrixOwners:
    """Who orthogonalizes which Muon matrix, and the exchanges of rows with the owners.

    Parameters
    ----------
    shapes : sequence of tuple of int
        The Muon parameters' shapes (two or more dimensions).
    dtypes : sequence of str
        Their dtypes (``"float32"``, ...): the dtype of the exchanged rows.
    splits : sequence of int
        Their ``split`` (:func:`~matroot.optim.muon.core.matrix_stack_shape`).
    world, rank : int
    dims : sequence of int, optional
        The dimension each parameter's parts are chunks of (0, the default: rows;
        or :func:`column_dim`).
    ranges : sequence, optional
        Per parameter, each rank's chunk ``(start, stop)`` of that dimension (default
        :func:`row_ranges`, ``torch.chunk``'s cut).

    Attributes
    ----------
    plan : BlockPlan
        One block per matrix, grouped by shape and dtype.
    split : ShardPlan
        Blocks of each group per rank (Shampoo's split, costed by polar products).
    matrices : list of OwnedMatrix
        Every matrix, group by group, each group's blocks in order.

    Examples
    --------
    >>> from matroot.optim.distributed.muon_owners import MatrixOwners
    >>> owners = MatrixOwners([(8, 4), (3, 8, 4), (6, 6)], ["float32"] * 3, [1, 1, 1], 2, 0)
    >>> [(m.param, m.rows, m.owner) for m in owners.matrices]  # 8×4s first, then the 6×6
    [(0, (0, 8), 0), (1, (0, 8), 0), (1, (8, 16), 0), (1, (16, 24), 1), (2, (0, 6), 1)]
    >>> owners.split.costs  # polar products per rank: 3·128 against 128 + 216
    (384, 344)
    """

    def __init__(self, shapes, dtypes, splits, world: int, rank: int, dims=None,
                 ranges=None):
        self.world, self.rank = world, rank
        #: Bytes this rank sent to other ranks in the exchanges so far.
        self.sent_bytes = 0
        self.shapes = [tuple(s) for s in shapes]
        self.dtypes = list(dtypes)
        layouts: list[ParamLayout] = []
        keyed: dict[tuple[int, int, str], list[Block]] = {}
        self._per_row = []          # rows of the view per row of the parameter
        for i, (shape, dtype, split) in enumerate(zip(self.shapes, dtypes, splits)):
            count, m, n = matrix_stack_shape(shape, split)
            layouts.append(ParamLayout(shape, (count * m, n), MATRIX, (False, False)))
            self._per_row.append(count * m // shape[0] if shape[0] else 1)
            keyed.setdefault((m, n, dtype), []).extend(
                Block(i, (k * m, (k + 1) * m), (0, n)) for k in range(count))
        groups = tuple(BlockGroup((m, n), dtype, tuple(blocks), None, None)
                       for (m, n, dtype), blocks in keyed.items())
        self.plan = BlockPlan(tuple(layouts), groups, (), math.inf)
        # A polar step's products; at least 1, so that empty matrices still count.
        costs = [max(1, m * n * min(m, n)) for m, n in (g.shape for g in groups)]
        self.split = shard_plan(self.plan, world, costs)
        self.matrices: list[OwnedMatrix] = []
        for g, group in enumerate(groups):
            for owner, (start, stop) in enumerate(self.split.ranges(g)):
                self.matrices.extend(OwnedMatrix(b.param, b.rows, group.shape[1], group.dtype,
                                                 owner) for b in group.blocks[start:stop])
        self.dims = [0] * len(self.shapes) if dims is None else [int(d) for d in dims]
        self._ranges = [tuple(row_ranges(shape[d], world)) for shape, d in
                        zip(self.shapes, self.dims)] if ranges is None else \
            [tuple(tuple(r) for r in rs) for rs in ranges]
        #: Per parameter and rank, the rectangle ``(row0, row1, col0, col1)`` of the
        #: ``(count·m, n)`` view that rank holds.
        self._held = [[self._rectangle(i, a, b) for a, b in self._ranges[i]]
                      for i in range(len(self.shapes))]

    def _rectangle(self, param: int, a: int, b: int) -> tuple[int, int, int, int]:
        shape, dim = self.shapes[param], self.dims[param]
        per = self._per_row[param]
        view_rows = shape[0] * per
        cols = math.prod(shape) // view_rows if view_rows else 0
        if dim == 0:
            return (a * per, b * per, 0, cols)
        if dim != column_dim(shape):
            raise ValueError(f"a Muon parameter of shape {shape} cannot keep its state in "
                             f"chunks of dimension {dim}: 0 or {column_dim(shape)}")
        inner = math.prod(shape[dim + 1:])
        return (0, view_rows, a * inner, b * inner)

    def local_rows(self, param: int, rank: int | None = None) -> tuple[int, int]:
        """The chunk ``[start, stop)`` of parameter ``param``'s split dimension
        (``dims[param]``) that ``rank`` (default this one) keeps."""
        return self._ranges[param][self.rank if rank is None else rank]

    def local_shape(self, param: int, rank: int | None = None) -> tuple[int, ...]:
        """The shape of ``rank``'s (default this one's) part of parameter ``param``."""
        start, stop = self.local_rows(param, rank)
        shape, dim = list(self.shapes[param]), self.dims[param]
        shape[dim] = stop - start
        return tuple(shape)

    def _overlap(self, matrix: OwnedMatrix, rank: int) -> tuple[int, int, int, int]:
        """The rectangle ``(lo, hi, c0, c1)`` of ``matrix``'s view rows and columns
        that ``rank`` holds (``hi == lo`` or ``c1 == c0``: none)."""
        r0, r1, c0, c1 = self._held[matrix.param][rank]
        lo, hi = max(r0, matrix.rows[0]), min(r1, matrix.rows[1])
        return (lo, max(lo, hi), c0, c1)

    def _elements(self, matrix: OwnedMatrix, rank: int) -> int:
        """Elements of ``matrix`` that ``rank`` holds."""
        lo, hi, c0, c1 = self._overlap(matrix, rank)
        return (hi - lo) * (c1 - c0)

    def _local_view(self, tensor, param: int, rank: int):
        """``rank``'s part of parameter ``param`` as rows of its view (``(rows, c1 − c0)``)."""
        r0, r1, c0, c1 = self._held[param][rank]
        return tensor.reshape(r1 - r0, c1 - c0)

    def owned(self, present) -> list[OwnedMatrix]:
        """This rank's matrices of the parameters ``present`` says have a gradient."""
        return [m for m in self.matrices if m.owner == self.rank and present[m.param]]

    def _exchange(self, dtype, pieces_out, sizes_in, group, device):
        """One ``all_to_all``: ``pieces_out[r]`` (flat tensors) to rank r; returns what
        each rank sent here, split by ``sizes_in[r]`` (lists of element counts)."""
        send = [torch.cat([p.reshape(-1) for p in pieces]) if pieces else
                torch.empty(0, dtype=dtype, device=device) for pieces in pieces_out]
        self.sent_bytes += sum(t.numel() * t.element_size()
                               for r, t in enumerate(send) if r != self.rank)
        recv = torch.empty(sum(sum(s) for s in sizes_in), dtype=dtype, device=device)
        dist.all_to_all_single(recv, torch.cat(send), output_split_sizes=[sum(s) for s in sizes_in],
                               input_split_sizes=[t.numel() for t in send], group=group)
        return recv.split([n for sizes in sizes_in for n in sizes])

    def to_owners(self, local_rows: dict, present, group, device) -> dict:
        """Every owned matrix whole, from every rank's rows of it.

        Parameters
        ----------
        local_rows : dict
            Muon parameter number → this rank's part of it (a tensor of
            :meth:`local_shape`).
        present : sequence of bool
            Per Muon parameter, whether it has a gradient (the same on every rank).

        Returns
        -------
        dict
            ``OwnedMatrix`` → the whole ``(m, n)`` matrix, for this rank's matrices.
        """
        out = {}
        for dtype in sorted({m.dtype for m in self.matrices}):
            torch_dtype = getattr(torch, dtype)
            live = [m for m in self.matrices if m.dtype == dtype and present[m.param]]
            if not live:
                continue
            pieces_out: list[list] = [[] for _ in range(self.world)]
            for m in live:
                if self._elements(m, self.rank):
                    lo, hi, _, _ = self._overlap(m, self.rank)
                    start = self._held[m.param][self.rank][0]
                    view = self._local_view(local_rows[m.param], m.param, self.rank)
                    pieces_out[m.owner].append(view[lo - start:hi - start])
            mine = [m for m in live if m.owner == self.rank]
            sizes_in = [[self._elements(m, r) for m in mine] for r in range(self.world)]
            parts = iter(self._exchange(torch_dtype, pieces_out, sizes_in, group, device))
            by_rank = [[next(parts) for _ in mine] for _ in range(self.world)]
            for k, m in enumerate(mine):
                if self.dims[m.param] == 0:     # row parts: one concatenation
                    out[m] = torch.cat([by_rank[r][k] for r in range(self.world)]).reshape(
                        m.rows[1] - m.rows[0], m.cols)
                    continue
                whole_matrix = torch.empty((m.rows[1] - m.rows[0], m.cols), dtype=torch_dtype,
                                           device=device)
                for r in range(self.world):
                    lo, hi, c0, c1 = self._overlap(m, r)
                    if (hi - lo) * (c1 - c0):
                        whole_matrix[lo - m.rows[0]:hi - m.rows[0], c0:c1] = \
                            by_rank[r][k].view(hi - lo, c1 - c0)
                out[m] = whole_matrix
        return out

    def from_owners(self, factors: dict, present, group, device) -> dict:
        """Every rank's part of every present Muon parameter's factor, from the owners.

        ``factors``: this rank's matrices (``OwnedMatrix`` → ``(m, n)`` factor). Returns
        Muon parameter number → its part here, shaped as in :meth:`to_owners`.
        """
        out: dict = {}
        for dtype in sorted({m.dtype for m in self.matrices}):
            torch_dtype = getattr(torch, dtype)
            live = [m for m in self.matrices if m.dtype == dtype and present[m.param]]
            if not live:
                continue
            pieces_out: list[list] = [[] for _ in range(self.world)]
            for m in live:
                if m.owner == self.rank:
                    for r in range(self.world):
                        lo, hi, c0, c1 = self._overlap(m, r)
                        if (hi - lo) * (c1 - c0):
                            pieces_out[r].append(
                                factors[m][lo - m.rows[0]:hi - m.rows[0], c0:c1])
            sizes_in = [[self._elements(m, self.rank) for m in live if m.owner == r]
                        for r in range(self.world)]
            parts = iter(self._exchange(torch_dtype, pieces_out, sizes_in, group, device))
            for r in range(self.world):
                for m in (m for m in live if m.owner == r):
                    part = next(parts)
                    if part.numel() == 0:
                        continue
                    if m.param not in out:
                        out[m.param] = torch.empty(self.local_shape(m.param),
                                                   dtype=torch_dtype, device=device)
                    lo, hi, c0, c1 = self._overlap(m, self.rank)
                    start = self._held[m.param][self.rank][0]
                    view = self._local_view(out[m.param], m.param, self.rank)
                    view[lo - start:hi - start] = part.view(hi - lo, c1 - c0)
        for i in range(len(self.shapes)):     # nothing here: an empty part
            if present[i] and i not in out:
                out[i] = torch.empty(self.local_shape(i), dtype=getattr(torch, self.dtypes[i]),
                                     device=device)
        return out
