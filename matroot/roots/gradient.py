"""The derivative of the inverse root, for reverse-mode differentiation.

For symmetric ``S = V·diag(λ)·Vᵀ`` and ``f(λ) = (λ + eps)^(-1/p)``, the
Daleckii–Krein theorem gives the derivative of ``F(S) = f(S)`` in a direction
``E`` as ``V·(Γ ∘ (Vᵀ·E·V))·Vᵀ`` with the first divided differences
``Γᵢⱼ = (f(λᵢ) − f(λⱼ))/(λᵢ − λⱼ)`` (``f'(λᵢ)`` where ``λᵢ = λⱼ``). Γ is symmetric,
so the map is self-adjoint: the same expression is the forward derivative (JVP)
and, applied to the output's cotangent, the cotangent of ``S``. The root is a
function of ``(A + Aᵀ)/2``, so both take the symmetric part of ``E``, which the
symmetric part of the result gives (Γ symmetric).

This is the derivative of the exact root at the input, whichever method computed
the returned root (the solvers stop on data-dependent tests, whose own
derivatives are not this one). It costs one eigendecomposition, in float64 where
the namespace has it, per backward pass.
"""

from __future__ import annotations

from .. import _xp
from ..certify.accuracy import unit_roundoff

__all__ = ["inv_root_derivative"]


def inv_root_derivative(a, direction, p: float, eps: float):
    """The derivative of ``root = (sym(a) + eps·I)^(-1/p)`` at ``a`` in ``direction``,
    which is also the cotangent of ``a`` for a cotangent ``direction`` of the root.

    Parameters
    ----------
    a : array, shape (..., n, n)
        The input of the root (any real floating dtype).
    direction : array, shape (..., n, n)
        A direction in ``a``'s space (forward mode), or the cotangent of the root
        (reverse mode). Linear operations only touch it, so JAX can transpose them.
    p, eps : float
        The root's order and ridge.

    Returns
    -------
    array, shape (..., n, n)
        Symmetric, in ``a``'s dtype. NaN for a matrix where ``A + eps·I`` is not
        positive definite or has NaN/Inf entries (the root is not differentiable
        there); the other matrices are unaffected.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.roots.gradient import inv_root_derivative
    >>> a = np.diag([4.0, 4.0])  # d/da (a^(-1/2)) = -a^(-3/2)/2 = -1/16
    >>> inv_root_derivative(a, np.eye(2), 2, 0.0).tolist()
    [[-0.0625, 0.0], [0.0, -0.0625]]
    """
    # One compiled program on JAX: jax.grad evaluated the eigh and the formula's dozens
    # of operations one by one, each compiled on first use (44 programs per shape).
    return _xp.one_program(_derivative, a, dict(direction=direction, eps=eps), p=p)


def _derivative(a, *, direction, p: float, eps):
    xp = _xp.array_namespace(a)
    work = xp.float64 if _xp.has_float64(xp) else xp.float32
    shape, n = tuple(a.shape), a.shape[-1]
    s = xp.reshape(_xp.symmetric_part(xp.astype(a, work)), (-1, n, n))
    eye = _xp.identity_stack(xp, n, work, _xp.device_of(s))
    # A matrix with NaN/Inf (check_finite=False) gets NaN, not a failed eigh that
    # raises for the whole batch.
    finite = _xp.finite_matrices(s)
    s = _xp.batched_where(finite, s, eye) + eps * eye
    lam, vec = _xp.lapack_in_order(xp.linalg.eigh, s)
    f = lam ** (-1.0 / p)
    lam_i, lam_j = lam[..., :, None], lam[..., None, :]
    gap = lam_i - lam_j
    # Where two eigenvalues nearly coincide the quotient cancels; f' at their mean is
    # then within (gap/λ)² of it. The cut u^(1/3) balances the two errors.
    close = xp.abs(gap) <= unit_roundoff(xp, work) ** (1 / 3) * xp.maximum(
        xp.abs(lam_i), xp.abs(lam_j))
    mean = (lam_i + lam_j) / 2
    slope = -(1.0 / p) * mean ** (-1.0 / p - 1.0)
    quotient = (f[..., :, None] - f[..., None, :]) / xp.where(close, xp.ones_like(gap), gap)
    gamma = xp.where(close, slope, quotient)
    vec_t = xp.matrix_transpose(vec)
    inner = vec_t @ xp.reshape(xp.astype(direction, work), (-1, n, n)) @ vec
    out = _xp.symmetric_part(vec @ (gamma * inner) @ vec_t)
    out = _xp.batched_where(finite, out, xp.full_like(out, float("nan")))
    return xp.astype(xp.reshape(out, shape), a.dtype)
