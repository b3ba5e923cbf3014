"""Reference polar factors from a decomposition: ``U·Vᵀ`` from the SVD, or
``X·(XᵀX)^(-1/2)`` from ``eigh`` of the Gram matrix (which squares κ).

Singular values at or below ``n·u·σmax`` count as zero and map to zero, as the
polynomial iterations map them, so a rank-deficient input gets the partial
isometry ``U_r·V_rᵀ`` on its range rather than an arbitrary completion.
"""

from __future__ import annotations

from ... import _xp
from ...certify.accuracy import unit_roundoff


def _rank_mask(values, top, count: int, unit_roundoff: float):
    """Per singular value (or eigenvalue ``values``): is it above the rank cut?"""
    return values > (count * unit_roundoff) * top[..., None]


def svd_polar(x, gram, rows, matmul):
    """``U·Vᵀ`` over the singular values above the rank cut (no products counted)."""
    xp = _xp.array_namespace(x)
    u, s, vt = _xp.lapack_in_order(lambda m: xp.linalg.svd(m, full_matrices=False), x)
    unit = unit_roundoff(xp, x.dtype)
    keep = xp.astype(_rank_mask(s, s[..., 0], x.shape[-1], unit), x.dtype)
    return (u * keep[..., None, :]) @ vt


def eigh_polar(x, gram, rows, matmul):
    """``X·V·Λ^(-1/2)·Vᵀ`` from ``eigh(XᵀX)``; eigenvalues at or below the rank cut
    (in σ², so ``n·u`` relative to λmax) give zero directions. Two products."""
    xp = _xp.array_namespace(x)
    lam, v = _xp.lapack_in_order(xp.linalg.eigh, _xp.symmetric_part(gram))
    unit = unit_roundoff(xp, x.dtype)
    keep = _rank_mask(lam, lam[..., -1], x.shape[-1], unit)
    safe = xp.where(keep, lam, xp.ones_like(lam))
    weights = xp.where(keep, 1.0 / xp.sqrt(safe), xp.zeros_like(lam))
    return matmul(x, matmul(v * weights[..., None, :], xp.matrix_transpose(v)))
