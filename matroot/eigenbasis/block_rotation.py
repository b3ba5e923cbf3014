"""Block refresh: the dominant columns by subspace iteration and Rayleigh–Ritz, the rest
turned by the direct rotation that keeps them orthogonal to those — thin products only.

The basis is held as rows (``Qᵀ``, each row an eigenvector) together with
``Zᵀ = Qᵀ·A`` (``A`` symmetric), split once per call into the ``k`` rows of largest
Rayleigh quotient (the top block) and the rest: choosing them is one gather of whole
rows, and no step re-sorts (subspace iteration keeps the top block dominant). One step:

1. ``Y = qr(Z_t + σ·Q_t)`` (one step of subspace iteration for the top block, an n×k
   QR; the small shift ``σ`` keeps null-space columns where they were), then
   Rayleigh–Ritz: ``W = A·Y``, ``eigh(YᵀW) = (θ, V)``, ``T = Y·V``;
2. the rest: in the coordinates ``X = QᵀT = [X_t; X_r]``, the direct rotation (the
   smallest rotation taking ``span(Q_t)`` to ``span(T)``) maps ``Q_r`` to
   ``Q_r − (Q_r·F·diag(1/(1 + c)) + Q_t·U)·Fᵀ``, where ``X_t = U·diag(c)·Vᵀ``
   (SVD of a k×k matrix, ``c`` the cosines of the principal angles) and
   ``F = X_r·V``. Exactly orthonormal and orthogonal to ``T`` for an orthonormal
   ``Q``, and stable at any angle (no division by a sine);
3. ``A`` times the new rest is the same update of ``Z_r``: the residual of the new
   basis is exact without another n×n product.

Cost: the first product ``A·Q`` and about ``6·k/n`` of one per step (k = n/8: 1.75
products per one-step refresh; a float32 eigh costs 6–9 on the CPU measured,
bench/results/eigenbasis.md). What it does not turn: couplings within the rest; a
factor whose mass lies beyond its top ``k`` directions needs a larger ``block`` (or
orthogonal iteration, ``method="orthogonal"``). The basis must be orthonormal: the
columns are normalised, and ``‖QᵀQ − I‖_F`` of the result is bounded by probes
(:func:`~.certificate.orthogonality_bound`) and counted against ``rtol``.
"""

from __future__ import annotations

import math

from .. import _xp
from .certificate import orthogonality_bound, rounding_allowance
from .orthogonal_iteration import SHIFT

__all__ = ["default_block", "block_rotation"]


def default_block(n: int) -> int:
    """The block size used when none is given: ``ceil(n/8)``.

    Examples
    --------
    >>> default_block(1024), default_block(5)
    (128, 1)
    """
    return max(1, math.ceil(n / 8))


def _rows(x, index):
    """``x[i][index[i]]`` for a ``(b, n, c)`` stack and ``(b, m)`` indices: one gather of
    whole rows (a column gather would read the stack once per index entry)."""
    xp = _xp.array_namespace(x)
    b, n, c = x.shape
    offsets = xp.arange(b, dtype=index.dtype, device=_xp.device_of(x)) * n
    flat = xp.reshape(index + offsets[:, None], (-1,))
    return xp.reshape(xp.take(xp.reshape(x, (b * n, c)), flat, axis=0), (b, index.shape[-1], c))


def _quotients_and_residual(qt, zt):
    """Per row the quotient ``dᵢ = qᵢ·zᵢ`` (the rows are unit vectors up to the
    orthogonality the certificate bounds; the residual below holds for any ``d``), and
    per matrix ``‖Zᵀ − diag(d)·Qᵀ‖_F`` (not yet divided by ‖A‖_F)."""
    xp = _xp.array_namespace(qt)
    d = xp.sum(qt * zt, axis=-1)
    return d, _xp.frobenius_norm(_xp.add_scaled(zt, -d[..., None], qt))


def _block_step(a, shift, qt_t, zt_t, qt_r, zt_r, *, overwrite: bool = False):
    """One block step on the rows ``(Q_t, Z_t)`` (top) and ``(Q_r, Z_r)`` (rest);
    ``overwrite``: the rest's arrays are not read afterwards (their update may be
    written over them)."""
    xp = _xp.array_namespace(a)
    mt = xp.matrix_transpose
    y = _xp.lapack_in_order(xp.linalg.qr, mt(_xp.add_scaled(zt_t, shift, qt_t)))[0]
    w = a @ y
    h = mt(y) @ w
    v = _xp.lapack_in_order(xp.linalg.eigh, (h + mt(h)) / 2)[1]
    top, z_top = y @ v, w @ v
    u, c, vh = _xp.lapack_in_order(xp.linalg.svd, qt_t @ top)
    f = (qt_r @ top) @ mt(vh)
    # Q_r − F·(diag(1/(1 + c))·Fᵀ·Q_r + Uᵀ·Q_t), the same for Z_r; the subtraction is
    # folded into the product (one pass over the rest fewer on torch).
    damped, ut, minus_f = mt(f) * (1 / (1 + c))[:, :, None], mt(u), -f
    update = _xp.add_product_over if overwrite else _xp.add_product
    qt_r = update(qt_r, minus_f, _xp.add_product_over(ut @ qt_t, damped, qt_r))
    zt_r = update(zt_r, minus_f, _xp.add_product_over(ut @ zt_t, damped, zt_r))
    return mt(top), mt(z_top), qt_r, zt_r


def block_rotation(a, basis, *, iterations: int, rtol: float, block: int, traced: bool):
    """Refresh ``basis`` towards the eigenvectors of the symmetric stack ``a`` by block steps.

    Parameters and returns as :func:`~.orthogonal_iteration.orthogonal_iteration`, with
    ``block`` the number of dominant columns refreshed by subspace iteration (1…n).
    """
    xp = _xp.array_namespace(a)
    b, n = a.shape[0], a.shape[-1]
    device = _xp.device_of(a)
    norm = _xp.frobenius_norm(a)
    positive = norm > 0
    safe_norm = xp.where(positive, norm, xp.ones_like(norm))[:, None]
    shift = xp.where(positive, SHIFT * norm, xp.ones_like(norm))[:, None, None]
    allowance = rounding_allowance(n, float(xp.finfo(a.dtype).eps) / 2)
    # Rows in a fresh row-major copy first: the lengths (a reduction) and the products
    # then round alike whatever the layout of the start (a NaN neighbour's select
    # would otherwise change a matrix's result).
    qt = xp.reshape(xp.reshape(xp.matrix_transpose(basis), (b * n, n)), (b, n, n))
    lengths = xp.linalg.vector_norm(qt, axis=-1)
    qt = qt / xp.where(lengths > 0, lengths, xp.ones_like(lengths))[:, :, None]
    zt = qt @ a
    # The one sort of the call: the top block is the k rows of largest quotient.
    order = xp.argsort(xp.sum(qt * zt, axis=-1), axis=-1, descending=True)
    top, rest = order[:, :block], order[:, block:]
    rows = (_rows(qt, top), _rows(zt, top), _rows(qt, rest), _rows(zt, rest))
    state = (*rows, xp.zeros((b, block), dtype=a.dtype, device=device),
             xp.zeros((b, n - block), dtype=a.dtype, device=device),
             xp.full((b,), math.inf, dtype=a.dtype, device=device),
             xp.zeros((b,), dtype=xp.bool, device=device),
             xp.zeros((b,), dtype=xp.int32, device=device))

    def step(state, k):
        *old, residual, done, steps = state
        first = isinstance(k, int) and k == 0   # then nothing reads the old rows again
        new = _block_step(a, shift, *old[:4], overwrite=first)
        d_top, r_top = _quotients_and_residual(new[0], new[1])
        d_rest, r_rest = _quotients_and_residual(new[2], new[3])
        new = (*new, d_top, d_rest)
        new_residual = xp.sqrt(r_top * r_top + r_rest * r_rest) / safe_norm[:, 0]
        if not first:  # before the first step none is done
            new = tuple(xp.where(xp.reshape(done, (-1,) + (1,) * (now.ndim - 1)), was, now)
                        for was, now in zip(old, new))
            new_residual = xp.where(done, residual, new_residual)
        steps = xp.where(done, steps, steps + 1)
        return (*new, new_residual, done | (new_residual + allowance <= rtol), steps)

    qt_t, _, qt_r, _, d_top, d_rest, residual, _, steps = _xp.bounded_loop(
        step, state, max_iter=iterations, running=lambda s: ~xp.all(s[7]), check_every=1,
        traced=traced)
    d = xp.concat([d_top, d_rest], axis=-1)
    order = xp.argsort(d, axis=-1)
    q = xp.matrix_transpose(_rows(xp.concat([qt_t, qt_r], axis=-2), order))
    d = _rows(d[:, :, None], order)[:, :, 0]
    # The steps keep Q orthonormal only as far as the start was: bound what it is now.
    residual = residual + orthogonality_bound(q)
    return q, d, residual, residual + allowance <= rtol, steps
