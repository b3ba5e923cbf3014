"""Warm-started orthogonal (subspace) iteration on ``(b, n, n)`` stacks, with the residual
that certifies its result.

One step from a basis ``Q`` with ``Z = (A + σ·I)·Q`` in hand:

1. sort the columns by their Rayleigh quotients, largest first, so that the leading
   columns of the triangular factorisation are the dominant eigenvectors (a basis
   from eigh comes in ascending order, which would drive every column towards the
   top eigenvector instead);
2. ``Q ← qr(Z)`` (Householder, the array API's ``linalg.qr``), each column's sign
   chosen so that it keeps pointing where it pointed (positive diagonal of R);
3. ``Z ← (A + σ·I)·Q``: the product the next step starts from, and what the residual
   ``‖A·Q − Q·diag(d)‖_F / ‖A‖_F`` (``d`` the Rayleigh quotients) is read from.

One product and one QR per step, plus the first product. The small shift
``σ = SHIFT·‖A‖_F`` changes no eigenvector and barely the convergence of the
columns that matter, but keeps the columns of a (near-)null space at their previous
directions instead of letting the QR complete them arbitrarily (a zero matrix keeps
its basis, orthonormalised). Each matrix stops once its residual, plus
:func:`~.certificate.rounding_allowance`, is at most ``rtol``; the loop stops when all have.

Why a full QR and not a cheaper update: a first-order (Jacobi-like) rotation from
``QᵀAQ`` divides by eigenvalue gaps and fails where a rank-deficient factor gains a
direction inside its (degenerate) null space, which the triangular factorisation of
``A·Q`` resolves in one step (docs/eigenbasis.rst, the measurements).
"""

from __future__ import annotations

import math

from .. import _xp
from .certificate import rayleigh_quotients, relative_residual, rounding_allowance

__all__ = ["SHIFT", "orthogonal_iteration", "shifted_iteration", "ascending"]

#: The shift σ as a fraction of ‖A‖_F.
SHIFT = 2.0 ** -20


def _qr_step(a, shift, q, z, d):
    """One orthogonal-iteration step from ``Z = (A + σI)·Q`` and its quotients ``d``;
    returns the new basis, its product and its quotients."""
    xp = _xp.array_namespace(a)
    order = xp.argsort(d, axis=-1, descending=True)
    sorted_z = xp.take_along_axis(z, order[:, None, :], axis=-1)
    factors = _xp.lapack_in_order(xp.linalg.qr, sorted_z)
    signs = xp.sign(xp.linalg.diagonal(factors[1]))
    signs = xp.where(signs == 0, xp.ones_like(signs), signs)
    q = factors[0] * signs[:, None, :]
    z = shift * q + _xp.batched_matmul(a, q)
    return q, z, rayleigh_quotients(q, z)


def orthogonal_iteration(a, basis, *, iterations: int, rtol: float, traced: bool):
    """Refresh ``basis`` towards the eigenvectors of the symmetric stack ``a``.

    Parameters
    ----------
    a : array (b, n, n)
        Finite symmetric matrices, entries O(1) (the caller scales them).
    basis : array (b, n, n)
        Finite starting bases (orthonormal or not: the first QR orthonormalises).
    iterations : int
        Steps at most (≥ 1); a matrix stops at its first converged step.
    rtol : float
        The residual (plus the rounding allowance) to reach.
    traced : bool
        Under jax.jit (a device-side while loop) or torch.compile (all steps traced).

    Returns
    -------
    tuple
        ``(eigenvectors, eigenvalues, residual, converged, steps)``: columns in
        ascending order of eigenvalue, as eigh returns them; per-matrix residuals,
        convergence and steps taken.
    """
    q, d, residual, done, steps, shift, _ = shifted_iteration(
        a, basis, _qr_step, iterations=iterations, rtol=rtol, traced=traced)
    return (*ascending(q, d, shift), residual, done, steps)


def shifted_iteration(a, basis, advance, *, iterations: int, rtol: float, traced: bool):
    """Steps ``(q, z, d) = advance(a, σ, q, z, d)`` on ``Z = (A + σI)·Q`` until each matrix's
    residual plus the rounding allowance is at most ``rtol`` (a matrix keeps its first
    such step); the loop both refresh methods share.

    Returns
    -------
    tuple
        ``(q, d, residual, done, steps, shift, allowance)``: the bases, their Rayleigh
        quotients of ``A + σI`` (unsorted), per-matrix residuals, convergence and steps,
        the shifts σ (b, 1, 1) and the rounding allowance.
    """
    xp = _xp.array_namespace(a)
    norm = _xp.frobenius_norm(a)
    positive = norm > 0
    safe_norm = xp.where(positive, norm, xp.ones_like(norm))
    shift = xp.where(positive, SHIFT * norm, xp.ones_like(norm))[:, None, None]
    allowance = rounding_allowance(a.shape[-1], float(xp.finfo(a.dtype).eps) / 2)
    z = shift * basis + _xp.batched_matmul(a, basis)
    b = a.shape[0]
    device = _xp.device_of(a)
    state = (basis, z, rayleigh_quotients(basis, z),
             xp.full((b,), math.inf, dtype=a.dtype, device=device),
             xp.zeros((b,), dtype=xp.bool, device=device),
             xp.zeros((b,), dtype=xp.int32, device=device))

    def step(state, k):
        q, z, d, residual, done, steps = state
        new_q, new_z, new_d = advance(a, shift, q, z, d)
        new_residual = relative_residual(new_q, new_z, new_d, safe_norm)
        q = _xp.batched_where(done, q, new_q)
        z = _xp.batched_where(done, z, new_z)
        d = xp.where(done[:, None], d, new_d)
        residual = xp.where(done, residual, new_residual)
        steps = xp.where(done, steps, steps + 1)
        return q, z, d, residual, done | (residual + allowance <= rtol), steps

    q, _, d, residual, done, steps = _xp.bounded_loop(
        step, state, max_iter=iterations, running=lambda s: ~xp.all(s[4]), check_every=1,
        traced=traced)
    return q, d, residual, done, steps, shift, allowance


def ascending(q, d, shift):
    """Columns and eigenvalues in ascending order, as eigh returns them, with σ taken off."""
    xp = _xp.array_namespace(q)
    order = xp.argsort(d, axis=-1)
    q = xp.take_along_axis(q, order[:, None, :], axis=-1)
    return q, xp.take_along_axis(d, order, axis=-1) - shift[:, :, 0]
