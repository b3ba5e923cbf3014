"""The eigenbasis half of a SOAP step: blocks into and out of their eigenbasis, the
factors' accumulation, and the refresh that rotates the moments into the new basis.

A block ``G`` (``r×c``) whose left and right factors have eigenvectors ``Q_L``, ``Q_R``
is seen in the eigenbasis as ``G̃ = Q_Lᵀ·G·Q_R`` and a direction ``D̃`` there goes back as
``Q_L·D̃·Q_Rᵀ``; a side without a factor has the identity (a one-sided block). A vector
block (``precondition_1d``) has its left side only. Every function works on the whole
``(k, ...)`` stack of a block group (or of a run of its blocks) at once.

**Moments on a basis change.** With ``P = Q_newᵀ·Q_old`` on each side, the first
moment, linear in the gradient, is rotated exactly: ``m̃ ← P_L·m̃·P_Rᵀ`` (what SOAP's
reference implementation and Distributed Shampoo get by keeping ``m`` in the
parameter's basis and projecting it at every step; kept in the eigenbasis here, the
step costs two products per block fewer). The second moment is a diagonal statistic
and has no exact rotation; it is mapped by the squared rotations,
``ṽ ← (P_L∘P_L)·ṽ·(P_R∘P_R)ᵀ``, the diagonal of the rotated second moment when the
rotated coordinates are uncorrelated (the assumption Adam makes in the basis). It
equals SOAP's reference rule (``ṽ`` permuted as the eigenvalues are re-sorted)
whenever the new basis is the old one up to order and signs, and it follows columns
that swap places when eigenvalues cross, which Distributed Shampoo's rule (``ṽ``
kept as it is) does not.
"""

from __future__ import annotations

from ... import _xp
from ...eigenbasis import refresh_eigenbasis
from ..shampoo_core.blocking import BlockGroup
from ..shampoo_core.stack_io import assign
from .config import SOAPConfig

__all__ = ["side_slots", "to_eigenbasis", "from_eigenbasis", "accumulate_factors",
           "refresh_bases"]


def side_slots(stacks, group: BlockGroup):
    """The ``(k, n, n)`` slices of ``stacks`` that hold ``group``'s left and right
    matrices (None for a side without a factor)."""
    k = len(group.blocks)
    return tuple(None if side is None else stacks[side[0]][side[1]:side[1] + k, ...]
                 for side in (group.left, group.right))


def _transpose(xp, q):
    return xp.matrix_transpose(q)


def to_eigenbasis(xp, blocks, left, right):
    """``Q_Lᵀ·G·Q_R`` for each block (a side that is None: the identity)."""
    if blocks.ndim == 2:    # vector blocks: Q_Lᵀ·g
        return (_transpose(xp, left) @ blocks[..., None])[..., 0]
    if left is not None:
        blocks = _transpose(xp, left) @ blocks
    if right is not None:
        blocks = blocks @ right
    return blocks


def from_eigenbasis(xp, blocks, left, right):
    """``Q_L·D̃·Q_Rᵀ`` for each block: the inverse of :func:`to_eigenbasis`."""
    if blocks.ndim == 2:
        return (left @ blocks[..., None])[..., 0]
    if left is not None:
        blocks = left @ blocks
    if right is not None:
        blocks = blocks @ _transpose(xp, right)
    return blocks


def accumulate_factors(xp, run: BlockGroup, blocks, factors, beta: float, *, in_place: bool,
                       step_taken=None) -> list:
    """``L ← β·L + (1−β)·G·Gᵀ`` and ``R ← β·R + (1−β)·Gᵀ·G`` in the run's slots (``g·gᵀ``
    for vector blocks); where ``step_taken`` is False they keep their values."""
    factors = list(factors)
    k = len(run.blocks)
    if blocks.ndim == 2:
        statistics = [(run.left, blocks[:, :, None] * blocks[:, None, :])]
    else:
        statistics = [(run.left, blocks @ _transpose(xp, blocks)),
                      (run.right, _transpose(xp, blocks) @ blocks)]
    for side, statistic in statistics:
        if side is None:
            continue
        stack, first = side
        index = (slice(first, first + k), ...)
        # beta = 1: running sums (Shampoo's convention for beta2 = 1).
        new = beta * factors[stack][index] + (1.0 - beta if beta < 1 else 1.0) * statistic
        factors[stack] = assign(factors[stack], index, new, in_place=in_place,
                                step_taken=step_taken)
    return factors


def _rotate_group(xp, group: BlockGroup, rotations, m, v):
    """The group's moments after its bases turned by ``rotations`` (``P`` per stack)."""
    p_left, p_right = side_slots(rotations, group)
    if m.ndim == 2:
        return to_eigenbasis(xp, m, _transpose(xp, p_left), None), \
            to_eigenbasis(xp, v, _transpose(xp, p_left * p_left), None)
    squares = [None if p is None else p * p for p in (p_left, p_right)]
    return from_eigenbasis(xp, m, p_left, p_right), from_eigenbasis(xp, v, *squares)


def refresh_bases(xp, plan, config: SOAPConfig, factors, bases, residuals, block_m,
                  block_v) -> tuple:
    """Every stack's eigenbasis refreshed from its last one (one
    :func:`matroot.refresh_eigenbasis` call per stack), the moments of every group
    rotated into the new bases. A matrix whose refresh is not finite keeps its basis.

    Returns
    -------
    bases, residuals, block_m, block_v : lists
    """
    bases, residuals = list(bases), list(residuals)
    rotations = []
    for s, factor in enumerate(factors):
        result = refresh_eigenbasis(factor, bases[s], iterations=config.eigenbasis_iterations,
                                    rtol=config.eigenbasis_rtol,
                                    method=config.eigenbasis_method)
        usable = xp.all(xp.isfinite(result.eigenvectors), axis=(-2, -1))
        new = _xp.batched_where(usable, result.eigenvectors, bases[s])
        rotations.append(_transpose(xp, new) @ bases[s])
        bases[s] = new
        residuals[s] = xp.where(usable, result.residual, residuals[s])
    block_m, block_v = list(block_m), list(block_v)
    for g, group in enumerate(plan.groups):
        block_m[g], block_v[g] = _rotate_group(xp, group, rotations, block_m[g], block_v[g])
    return bases, residuals, block_m, block_v
