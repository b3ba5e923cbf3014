"""The derivative of the polar factor, for the decompositions' reverse and forward modes.

For a tall ``G = U·Σ·Vᵀ`` (thin SVD, full column rank) the polar factor
``Q = U·Vᵀ`` moves in a direction ``E`` by

``dQ = U·((K − Kᵀ) ⊘ (σᵢ + σⱼ))·Vᵀ + (E·V − U·K)·Σ⁻¹·Vᵀ``,  ``K = Uᵀ·E·V``

(the rotation of the singular frames, and the part of ``E`` outside ``range(U)``).
The same expression applied to a cotangent ``Q̄`` is the cotangent of ``G``
(``⟨Q̄, dQ⟩ = ⟨dQ[Q̄], E⟩``: the map is self-adjoint), so one function serves both
modes. Its denominators are ``σᵢ + σⱼ`` and ``σᵢ``, never ``σᵢ − σⱼ``: repeated
singular values (an orthonormal ``G``, a multiple of the identity) are no
trouble, where an SVD's or eigendecomposition's own backward divides by their gap.
A wide ``G`` is its transpose's case. One SVD, in float64 where the namespace has
it, per derivative.
"""

from __future__ import annotations

from .. import _xp

__all__ = ["polar_derivative"]


def polar_derivative(g, direction):
    """The derivative of ``polar(g)`` at ``g`` in ``direction``; also the cotangent of
    ``g`` for a cotangent ``direction`` of the factor.

    Parameters
    ----------
    g : array, shape (..., m, n)
        The input of the polar factor (any real floating dtype).
    direction : array, shape (..., m, n)
        A direction in ``g``'s space, or the factor's cotangent.

    Returns
    -------
    array, shape (..., m, n)
        In ``g``'s dtype. NaN for a matrix that is rank-deficient or has NaN/Inf
        entries (the factor is not differentiable there); the others are unaffected.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.polar_factor.gradient import polar_derivative
    >>> e = np.array([[0.0, 1.0], [0.0, 0.0]])  # at 2·I only the skew part turns Q
    >>> polar_derivative(2 * np.eye(2), e).tolist()
    [[0.0, 0.25], [-0.25, 0.0]]
    """
    # One compiled program on JAX: an eager jax.grad ran the SVD and the formula's
    # operations one by one, each compiled on first use (50 programs per shape).
    return _xp.one_program(_derivative, g, dict(direction=direction))


def _derivative(g, *, direction):
    xp = _xp.array_namespace(g)
    work = xp.float64 if _xp.has_float64(xp) else xp.float32
    shape = tuple(g.shape)
    m, n = shape[-2:]
    x = xp.reshape(xp.astype(g, work), (-1, m, n))
    d = xp.reshape(xp.astype(direction, work), (-1, m, n))
    if m < n:
        x, d = xp.matrix_transpose(x), xp.matrix_transpose(d)
    finite = _xp.finite_matrices(x)
    x = _xp.batched_where(finite, x, xp.zeros_like(x))
    u, sigma, vt = _xp.lapack_in_order(lambda s: xp.linalg.svd(s, full_matrices=False), x)
    v = xp.matrix_transpose(vt)
    k = xp.matrix_transpose(u) @ d @ v
    rotation = (k - xp.matrix_transpose(k)) / (sigma[:, :, None] + sigma[:, None, :])
    outside = (d @ v - u @ k) / sigma[:, None, :]
    out = (u @ rotation + outside) @ vt
    out = _xp.batched_where(finite, out, xp.full_like(out, float("nan")))
    if m < n:
        out = xp.matrix_transpose(out)
    return xp.astype(xp.reshape(out, shape), g.dtype)
