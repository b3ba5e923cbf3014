"""Spectral bounds for stacks of symmetric matrices.

The iterative solvers converge only when the scaled spectrum lies in their basin,
and spend their iterations on the smallest scaled eigenvalues. A λmax bound close
from above keeps both in check: the power estimate times a safety factor, proven
by a Cholesky test (:func:`certified_lambda_max`); the Frobenius norm is a
guaranteed but loose upper bound (up to √n·λmax) that pushes small eigenvalues
towards 0. Lower bounds on
λmin (for Chebyshev's interval and the minimax schedule when no ridge gives one)
come from a few batched Lanczos steps with a safety factor.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import _xp
from ._checks import SCALINGS, check_choice, check_nonnegative, check_stack
from ._typing import Array

__all__ = ["power_iteration", "lambda_max_bound", "certified_lambda_max", "verified_upper",
           "CertifiedBound", "lambda_min_estimate",
           "lanczos_ritz_extremes", "RitzValues", "ritz_values", "SpectralBounds",
           "spectral_bounds"]

#: Power iteration returns a lower bound on λmax; this margin covers its shortfall.
POWER_SAFETY = 1.05

_START_SEED = 20240607

#: Lanczos steps of :func:`lambda_min_estimate` (matrix-vector products).
LANCZOS_STEPS = 64
#: Divisor that turns the smallest Ritz value (≥ λmin) into a lower-bound estimate.
LANCZOS_SAFETY = 4.0


@_xp.host_constant
def _start_matrix(n: int, k: int) -> np.ndarray:
    # A fixed-seed host draw: reproducible, never touches the global RNG, and the
    # same start on every backend so results agree across them.
    rng = np.random.default_rng(_START_SEED + 7919 * n + k)
    v = rng.standard_normal((n, k))
    v /= np.linalg.norm(v, axis=0, keepdims=True)
    v.flags.writeable = False
    return v


#: Start vectors kept on their devices, keyed by (backend, device, dtype, n, k)
#: as strings (not every backend's device object is hashable); oldest dropped first.
_START_VECTORS: dict = {}
_START_VECTORS_KEPT = 64


def _start_vectors(xp, n: int, k: int, dtype, device):
    # Kept, so the copy to the device happens once per size; callers only read it.
    key = (_xp.backend_name(xp), str(device), str(dtype), n, k)
    if key in _START_VECTORS:
        return _START_VECTORS[key]
    vectors = _xp.from_numpy(xp, _start_matrix(n, k), dtype=dtype, device=device)
    if _xp.is_traced(vectors):  # a traced value must not outlive its trace
        return vectors
    if len(_START_VECTORS) >= _START_VECTORS_KEPT:
        del _START_VECTORS[next(iter(_START_VECTORS))]
    _START_VECTORS[key] = vectors
    return vectors


def _entry_scale(xp, a):
    """Per-matrix max |entry|, with 1 for all-zero matrices (so a / scale is safe)."""
    # Two reductions, no |a| temporary (which costs more than both on torch CPU).
    m = xp.maximum(xp.max(a, axis=(-2, -1)), -xp.min(a, axis=(-2, -1)))
    return xp.where(m > 0, m, xp.ones_like(m))


_POWER_VECTORS = 4
_POWER_STEPS = 12
#: Matrix-vector products of one default :func:`power_iteration` (a matmul is n of them).
POWER_MATVECS = _POWER_VECTORS * _POWER_STEPS


def power_iteration(a: Array, /, *, num_vectors: int = _POWER_VECTORS,
                    num_iter: int = _POWER_STEPS) -> Array:
    """Batched multi-vector power iteration estimate of λmax for symmetric PSD stacks.

    Every matrix of the stack is iterated at once with ``num_vectors`` start
    vectors; the estimate is the largest ``‖A v‖ / ‖v‖`` seen, which for a PSD
    matrix is a lower bound on λmax that tightens with ``num_iter``.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive semidefinite matrices.
    num_vectors : int, optional
        Start vectors per matrix. More vectors help when the top eigenvalues cluster.
    num_iter : int, optional
        Multiplications by ``a``.

    Returns
    -------
    array, shape (...)
        λmax estimates (``<=`` the true λmax up to rounding); 0 for all-zero matrices.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.diag([1.0, 2.0, 5.0])
    >>> float(matroot.power_iteration(a))  # doctest: +ELLIPSIS
    4.99...
    """
    check_stack(a)
    return power_iteration_core(a, num_vectors=num_vectors, num_iter=num_iter)


def power_iteration_core(a: Array, *, num_vectors: int = _POWER_VECTORS,
                         num_iter: int = _POWER_STEPS) -> Array:
    """:func:`power_iteration` without input validation, for callers that checked ``a``."""
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    batch = a.shape[:-2]
    if n == 0 or 0 in batch:
        return xp.zeros(batch, dtype=a.dtype, device=_xp.device_of(a))
    scale = _entry_scale(xp, a)
    return _power_scaled(a / scale[..., None, None], num_vectors, num_iter) * scale


def _power_scaled(b, num_vectors: int = _POWER_VECTORS, num_iter: int = _POWER_STEPS):
    """:func:`power_iteration_core` of a stack whose entries are at most 1 in size."""
    xp = _xp.array_namespace(b)
    n = b.shape[-1]
    batch = b.shape[:-2]
    k = max(1, min(num_vectors, n))
    # Row vectors: for symmetric b, vᵀb = (bv)ᵀ, and a few rows times a matrix stream
    # it row by row (4 vectors, n = 256: 3-9× faster than b @ v on torch and NumPy CPU).
    v = xp.matrix_transpose(_start_vectors(xp, n, k, b.dtype, _xp.device_of(b)))
    v = xp.broadcast_to(v, (*batch, k, n))
    best = xp.zeros(batch, dtype=b.dtype, device=_xp.device_of(b))
    tiny = xp.finfo(b.dtype).smallest_normal
    for _ in range(num_iter):
        w = v @ b
        norms = xp.linalg.vector_norm(w, axis=-1)
        best = xp.maximum(best, xp.max(norms, axis=-1))
        v = w / xp.clip(norms, min=tiny)[..., None]
    return best


#: Factors tried on the power estimate, in order, until a Cholesky test certifies
#: one; past the last the guaranteed min(‖A‖_F, ‖A‖_∞) is used. 1.3 covers the
#: 20–25 % shortfall of an isolated top eigenvalue over a bulk at 0.75·λmax.
CERTIFY_FACTORS = (1.0, 1.3, 3.0)


class CertifiedBound(NamedTuple):
    """A certified λmax upper bound and what it cost (see :func:`certified_lambda_max`)."""

    bound: Array
    matmul_equivalents: Array


def _guaranteed_bound(xp, b):
    """min(‖B‖_F, ‖B‖_∞) with a relative margin for the rounding of the sums."""
    n = b.shape[-1]
    u = float(xp.finfo(b.dtype).eps) / 2
    frob = _xp.frobenius_norm(b)
    inf_norm = xp.max(xp.sum(xp.abs(b), axis=-1), axis=-1)
    return xp.minimum(frob, inf_norm) * (1 + 2 * (n + 2) * u)


def verified_upper(a: Array, bound: Array) -> Array:
    """Per matrix: is ``λmax(a) < bound`` proved by a floating-point Cholesky test?

    ``bound·I − a`` is positive definite exactly when ``λmax(a) < bound``. By
    Rump's verification of positive definiteness (BIT 46, 2006), a floating-point
    Cholesky factorisation that succeeds on ``C − s·I`` with
    ``s ≥ (n+1)·u·max_i C_ii/(1 − (n+1)·u)`` proves ``C`` positive definite;
    ``s = 2(n+2)·u·max_i C_ii`` is used, which also covers the rounding of
    forming ``C``. Cost: one batched Cholesky, n³/3 flops (1/6 of a matmul).
    """
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    u = float(xp.finfo(a.dtype).eps) / 2
    # The largest diagonal entry of bound·I − a is bound − min a_ii.
    diag_max = bound - xp.min(xp.linalg.diagonal(a), axis=-1)
    margin = 2 * (n + 2) * u * xp.maximum(diag_max, xp.zeros_like(diag_max))
    eye = _xp.identity_stack(xp, n, a.dtype, _xp.device_of(a))
    shift = (bound - margin)[..., None, None]
    return _xp.cholesky_succeeds(_xp.scaled_plus_identity(-a, 1.0, (shift,), eye,
                                                               overwrite=True))


def certified_lambda_max(a: Array, /, *, safety: float = POWER_SAFETY,
                         estimate: Array | None = None) -> CertifiedBound:
    """A proven upper bound on λmax of each symmetric matrix of a ``(b, n, n)`` stack.

    Power iteration (:func:`power_iteration`) gives a *lower* bound θ ≤ λmax: a
    Krylov method cannot see an eigenvector its start vectors miss, so no margin
    on θ alone is a proof. The candidate ``c = safety·θ·f`` (f from
    :data:`CERTIFY_FACTORS`) is kept only where :func:`verified_upper` proves
    ``λmax < c``; matrices no candidate certifies get the guaranteed
    ``min(‖A‖_F, ‖A‖_∞)`` (both ≥ λmax for symmetric A). The result is never
    below the true λmax (up to the rounding of the input itself) and, where the
    power estimate is good, within ``safety`` of it. A further factor is tried
    only when some matrix of the stack failed the previous one (one host check
    per factor, none inside any solver loop).

    ``estimate``, shape (b,), replaces the power iteration's θ by another lower
    estimate of λmax, e.g. the largest Ritz value of a Lanczos run the caller
    needs anyway (:func:`ritz_values`; 64 steps from one vector resolve the top
    better than 12 steps of 4). Only the Cholesky test makes a candidate the
    bound, so a poor estimate costs tightness, never the guarantee.

    Returns
    -------
    CertifiedBound
        ``bound`` (0 only for all-zero matrices) and ``matmul_equivalents``, the
        per-matrix cost in n×n matmuls: ``num_vectors·num_iter/n`` for the power
        iteration (none with ``estimate``) plus 1/6 per Cholesky test.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.scaling import certified_lambda_max
    >>> h = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]) / 2
    >>> a = (h * [1.0, 0.75, 0.75, 1e-4]) @ h.T         # eigenvalues 1, 0.75, 0.75, 1e-4
    >>> cert = certified_lambda_max(a[None])
    >>> bool(1.0 <= float(cert.bound[0]) <= 1.05), float(cert.matmul_equivalents[0])
    (True, 12.166666666666666)
    """
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    scale = _entry_scale(xp, a)
    b = a / scale[..., None, None]
    guaranteed = _guaranteed_bound(xp, b)
    if estimate is None:
        estimate, cost = _power_scaled(b) * safety, POWER_MATVECS / n
    else:
        estimate, cost = estimate / scale * safety, 0.0
    bound = guaranteed
    open_ = xp.ones(guaranteed.shape, dtype=xp.bool, device=_xp.device_of(a))
    cost = xp.zeros_like(guaranteed) + cost
    traced = _xp.is_traced(a)
    for factor in CERTIFY_FACTORS:
        candidate = estimate * factor
        trying = open_ & (candidate < guaranteed)
        # Traced, nothing can be read: every factor is tried (a Cholesky each).
        if not traced and not bool(xp.any(trying)):
            break
        proved = trying & verified_upper(b, candidate)
        bound = xp.where(proved, candidate, bound)
        cost = cost + xp.astype(trying, cost.dtype) / 6
        open_ = open_ & ~proved
    return CertifiedBound(bound * scale, cost)


def lambda_max_bound(a: Array, /, *, scaling: str = "power",
                     safety: float = POWER_SAFETY) -> Array:
    """A proven upper bound on λmax, used to scale the spectrum into (0, 1].

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive semidefinite matrices.
    scaling : {"power", "frobenius"}
        ``"power"``: the power estimate times ``safety``, certified by a Cholesky
        test (:func:`matroot.scaling.certified_lambda_max`), else the ∞-norm and
        Frobenius bounds. ``"frobenius"``: ‖A‖_F (never below λmax, up to √n·λmax).
    safety : float
        Factor on the power-iteration estimate.

    Returns
    -------
    array, shape (...)
        Upper bounds on λmax; 0 only for all-zero matrices.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.diag([1.0, 2.0, 5.0])
    >>> float(matroot.lambda_max_bound(a, scaling="frobenius"))  # doctest: +ELLIPSIS
    5.47...
    """
    check_stack(a)
    check_choice(scaling, "scaling", SCALINGS)
    return lambda_max_bound_core(a, scaling=scaling, safety=safety)


def lambda_max_bound_core(a: Array, *, scaling: str = "power",
                          safety: float = POWER_SAFETY) -> Array:
    """:func:`lambda_max_bound` without input validation, for callers that checked it."""
    xp = _xp.array_namespace(a)
    if scaling == "frobenius":
        scale = _entry_scale(xp, a)
        return _xp.frobenius_norm(a / scale[..., None, None]) * scale
    batch = tuple(a.shape[:-2])
    n = a.shape[-1]
    if n == 0 or 0 in batch:
        return xp.zeros(batch, dtype=a.dtype, device=_xp.device_of(a))
    flat = xp.reshape(a, (math.prod(batch), n, n))
    return xp.reshape(certified_lambda_max(flat, safety=safety).bound, batch)


def _lanczos_coefficients(a, num_steps: int):
    """Batched Lanczos with full reorthogonalisation, on the device.

    Returns ``(coefficients, steps)``: a ``(b, 2m + 1)`` array holding the
    ``m = steps`` diagonal entries α of the tridiagonal matrix of ``a / scale``,
    its ``m`` couplings β (the last one couples to the next Lanczos vector: 0
    once the Krylov space is exhausted) and the per-matrix entry scale.
    """
    xp = _xp.array_namespace(a)
    batch = tuple(a.shape[:-2])
    n = a.shape[-1]
    b = math.prod(batch)
    dev = _xp.device_of(a)
    scale = xp.reshape(_entry_scale(xp, a), (b,))
    mat = xp.reshape(a, (b, n, n)) / scale[:, None, None]
    steps = max(1, min(int(num_steps), n))
    # Below this β the Krylov space is exhausted (entries of mat are at most 1).
    breakdown = float(xp.finfo(a.dtype).eps) * n
    tiny = float(xp.finfo(a.dtype).smallest_normal)
    # Row vectors (vᵀA = (Av)ᵀ for symmetric A): a row times the stack streams it
    # row by row, ~9× faster than A @ v for one vector at n = 384 on torch CPU.
    fresh = xp.matrix_transpose(_start_vectors(xp, n, steps + 1, a.dtype, dev))
    run = _lanczos_rolled if _xp.is_traced(mat) else _lanczos_growing
    alphas, betas = run(xp, mat, fresh, steps, tiny, breakdown)
    betas = xp.where(betas <= breakdown, xp.zeros_like(betas), betas)
    return xp.concat([alphas, betas, scale[:, None]], axis=-1), steps


def _lanczos_growing(xp, mat, fresh, steps: int, tiny: float, breakdown: float):
    """The eager loop of :func:`_lanczos_coefficients`, its basis growing a row per
    step. Returns ``(alphas, betas)``, each ``(b, steps)``."""
    b, n = mat.shape[0], mat.shape[-1]
    # The loop calls the namespace directly: at n = 256 a step is a few dozen µs
    # of arithmetic, so wrapper overhead per call would dominate it.
    norm = xp.linalg.vector_norm
    v = xp.broadcast_to(fresh[:1, :], (b, 1, n))
    basis = v
    alphas, betas = [], []
    for j in range(steps):
        w = v @ mat
        # Two classical Gram-Schmidt passes keep the basis orthogonal to rounding.
        # The first one's last coefficient is vᵀAv = α; β is read between the
        # passes (the second changes it only to second order).
        h = w @ xp.matrix_transpose(basis)
        alphas.append(h[:, 0, -1])
        w = w - h @ basis
        beta = norm(w, axis=(-2, -1))
        betas.append(beta)
        if j == steps - 1:
            break
        # A breakdown restarts from a fresh vector, made orthogonal to the basis
        # by the second pass: the tridiagonal decouples and every Ritz value stays
        # inside the spectrum.
        w = xp.where((beta <= breakdown)[:, None, None], fresh[j + 1:j + 2, :], w)
        w = w - (w @ xp.matrix_transpose(basis)) @ basis
        v = w / xp.clip(norm(w, axis=(-2, -1)), min=tiny)[:, None, None]
        basis = xp.concat([basis, v], axis=-2)
    return xp.stack(alphas, axis=-1), xp.stack(betas, axis=-1)


def _lanczos_rolled(xp, mat, fresh, steps: int, tiny: float, breakdown: float):
    """The loop of :func:`_lanczos_coefficients` with shapes fixed from step to step,
    for tracing: under ``jax.jit`` one device loop (XLA compiled the unrolled
    growing-basis steps for seconds per call site). The basis is a fixed
    ``(b, steps, n)`` array whose rows not yet filled are zero: orthogonalising
    against it is the same arithmetic as against the filled rows alone. Returns
    ``(alphas, betas)``, each ``(b, steps)``.
    """
    b, n = mat.shape[0], mat.shape[-1]
    dev = _xp.device_of(mat)
    rows = xp.arange(steps, device=dev)[None, :]
    basis = xp.where((rows == 0)[..., None], fresh[None, :1, :],
                     xp.zeros((b, steps, n), dtype=mat.dtype))
    zeros = xp.zeros((b, steps), dtype=mat.dtype)

    def step(carry, j):
        basis, alphas, betas = carry
        index = xp.reshape(xp.asarray(j, device=dev), (1,))
        v = xp.take(basis, index, axis=1)
        w = v @ mat
        h = w @ xp.matrix_transpose(basis)
        alphas = xp.where(rows == j, h[:, 0, :], alphas)
        w = w - h @ basis
        beta = xp.linalg.vector_norm(w, axis=(-2, -1))
        betas = xp.where(rows == j, beta[:, None], betas)
        restart = xp.take(fresh, index + 1, axis=0)
        w = xp.where((beta <= breakdown)[:, None, None], restart[None], w)
        w = w - (w @ xp.matrix_transpose(basis)) @ basis
        v = w / xp.clip(xp.linalg.vector_norm(w, axis=(-2, -1)), min=tiny)[:, None, None]
        return xp.where((rows == j + 1)[..., None], v, basis), alphas, betas

    _, alphas, betas = _xp.counted_loop(step, (basis, zeros, zeros), steps, roll_like=mat)
    return alphas, betas


class RitzValues(NamedTuple):
    """Per matrix, the extreme Ritz values of one Lanczos run (see :func:`ritz_values`).

    Host float64 NumPy arrays after one transfer, or under jax.jit /
    torch.compile (nothing can be read back) device arrays in the input's dtype;
    shape ``a.shape[:-2]``, in the units of ``a``.
    """

    low: Array
    """θmin ≥ λmin (up to rounding)."""
    high: Array
    """θmax ≤ λmax (up to rounding)."""
    spread: Array
    """``β_m·|s_m|``: some eigenvalue lies within it of θmin."""

    def divided(self, scale: Array) -> RitzValues:
        """The Ritz values of ``a / scale`` (``scale`` per matrix, a device array)."""
        if isinstance(self.low, np.ndarray):
            scale = _xp.to_numpy(scale).astype(np.float64)
        return RitzValues(self.low / scale, self.high / scale, self.spread / scale)


def ritz_values(a: Array, *, num_steps: int = LANCZOS_STEPS) -> RitzValues:
    """One batched Lanczos run's extreme Ritz values, for every matrix of a stack.

    Both consumers read the same run (no input validation): the λmin estimate
    of the minimax schedule (:func:`lambda_min_estimate`) and the κ estimate
    of the a-posteriori check (:func:`matroot.verify.check_root`), so a call
    that needs both pays for one.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.scaling import ritz_values
    >>> r = ritz_values(np.diag([1.0, 2.0, 5.0]))
    >>> round(float(r.low), 6), round(float(r.high), 6), float(r.spread)
    (1.0, 5.0, 0.0)
    """
    batch = tuple(a.shape[:-2])
    if a.shape[-1] == 0 or 0 in batch:
        return RitzValues(np.zeros(batch), np.zeros(batch), np.zeros(batch))
    xp = _xp.array_namespace(a)
    coefficients, m = _lanczos_coefficients(a, num_steps)
    if _xp.is_traced(a):
        ns, dev = xp, _xp.device_of(a)

        def band(k):
            return _xp.from_numpy(xp, np.eye(m, k=k), dtype=a.dtype, device=dev)
    else:
        ns, coefficients = np, _xp.to_numpy(coefficients).astype(np.float64)

        def band(k):
            return np.eye(m, k=k)
    upper = coefficients[:, m:2 * m, None] * band(1)  # β_i at (i, i+1); β_m falls off
    tri = coefficients[:, :m, None] * band(0) + upper + ns.matrix_transpose(upper)
    ritz, vectors = _xp.lapack_in_order(ns.linalg.eigh, tri)
    last_beta = coefficients[:, 2 * m - 1] if m < a.shape[-1] else ns.zeros_like(ritz[:, 0])
    scale = coefficients[:, -1]
    spread = last_beta * ns.abs(vectors[:, -1, 0])
    return RitzValues(*(ns.reshape(v * scale, batch) for v in (ritz[:, 0], ritz[:, -1], spread)))


def lanczos_ritz_extremes(a: Array, /, *,
                          num_steps: int = LANCZOS_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest Ritz values of a batched Lanczos run, for every matrix.

    ``num_steps`` products ``A v`` per matrix (matrix-vector, not matrix-matrix,
    so about ``num_steps/n`` of one n×n matmul) with full reorthogonalisation,
    from a fixed-seed start vector; a breakdown (an invariant subspace found)
    restarts from a fresh vector orthogonal to the basis, which keeps every Ritz
    value inside ``[λmin, λmax]``. The small tridiagonal eigenproblems are solved
    on the host: one transfer per call.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric matrices.
    num_steps : int
        Lanczos steps (capped at n).

    Returns
    -------
    (ndarray, ndarray)
        Host float64 arrays of shape ``a.shape[:-2]``: ``θmin ≥ λmin`` and
        ``θmax ≤ λmax`` (up to rounding). Under jax.jit / torch.compile, where
        nothing can be read back, device arrays in ``a``'s dtype instead.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.scaling import lanczos_ritz_extremes
    >>> lo, hi = lanczos_ritz_extremes(np.diag([1.0, 2.0, 5.0]))
    >>> round(float(lo), 6), round(float(hi), 6)
    (1.0, 5.0)
    """
    check_stack(a)
    return lanczos_ritz_extremes_core(a, num_steps=num_steps)


def lanczos_ritz_extremes_core(a: Array, *, num_steps: int = LANCZOS_STEPS
                               ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`lanczos_ritz_extremes` without input validation, for callers that checked ``a``."""
    ritz = ritz_values(a, num_steps=num_steps)
    return ritz.low, ritz.high


def lambda_min_estimate(a: Array, /, lambda_max: Array, *, num_iter: int = LANCZOS_STEPS,
                        safety: float = LANCZOS_SAFETY) -> Array:
    """A λmin estimate meant as a lower bound, from a batched Lanczos run.

    The smallest Ritz value θ is an *upper* bound on λmin. Where its Ritz pair
    has converged (residual ``r = β_m·|s_m| ≤ (1 − 1/safety)·θ``: an eigenvalue
    lies within r of θ) the estimate is ``θ − r``; otherwise ``θ / safety``.
    Lanczos converges fast where the bottom of the spectrum is isolated or
    clustered (Shampoo-like low-rank-plus-ridge, Wishart) and slowly where it is
    smooth and dense: geometric spectra, n = 512, 64 steps give θ/λmin ≈ 1.0 at
    κ = 1e2, 2.3 at 1e4 and 47 at 1e6. An estimate that is too high costs the
    minimax iteration a few extra steps, one that is too low about one step per
    factor 16. Below about ``n·u·λmax`` (u the unit roundoff) θ is rounding noise.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive semidefinite matrices.
    lambda_max : array, shape (...)
        An upper bound on λmax; the estimate is clipped to ``[0, lambda_max]``.
    num_iter : int, optional
        Lanczos steps (matrix-vector products).
    safety : float, optional
        Divisor of an unconverged Ritz value.

    Returns
    -------
    array, shape (...)
        In the namespace, device and dtype of ``a``.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.diag([1.0, 2.0, 5.0])
    >>> round(float(matroot.lambda_min_estimate(a, np.asarray(5.0))), 6)
    1.0
    >>> b = np.diag(np.geomspace(1e-4, 1.0, 200))
    >>> est = float(matroot.lambda_min_estimate(b, np.asarray(1.0), num_iter=8))
    >>> bool(est < 1e-2)
    True
    """
    check_stack(a)
    return lambda_min_estimate_core(a, lambda_max, num_iter=num_iter, safety=safety)


def lambda_min_estimate_core(a: Array, lambda_max: Array, *,
                             num_iter: int = LANCZOS_STEPS,
                             safety: float = LANCZOS_SAFETY,
                             ritz: RitzValues | None = None) -> Array:
    """:func:`lambda_min_estimate` without input validation, for callers that checked
    ``a``; ``ritz``: that run's :func:`ritz_values` when the caller has them."""
    xp = _xp.array_namespace(a)
    batch = tuple(a.shape[:-2])
    if a.shape[-1] == 0 or 0 in batch:
        return xp.zeros(batch, dtype=a.dtype, device=_xp.device_of(a))
    if ritz is None:
        ritz = ritz_values(a, num_steps=num_iter)
    traced = _xp.is_traced(a)
    ns = xp if traced else np
    theta, spread = ritz.low, ritz.spread
    converged = spread <= (1.0 - 1.0 / safety) * theta
    estimate = ns.where(converged, theta - spread, theta / safety)
    estimate = ns.maximum(estimate, ns.zeros_like(estimate))
    # from_numpy makes 0-d arrays 1-d; restore the batch shape.
    out = estimate if traced else xp.reshape(
        _xp.from_numpy(xp, estimate, dtype=a.dtype, device=_xp.device_of(a)), batch)
    return xp.minimum(out, xp.astype(xp.asarray(lambda_max), a.dtype))


class SpectralBounds(NamedTuple):
    """Per-matrix spectral interval estimate ``[lambda_min, lambda_max]``."""

    lambda_min: Array
    lambda_max: Array


def spectral_bounds(a: Array, /, *, scaling: str = "power",
                    eps: float = 0.0) -> SpectralBounds:
    """Estimate the spectral interval of ``A + eps·I`` for every matrix of a stack.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive semidefinite matrices.
    scaling : {"power", "frobenius"}
        How λmax is bounded (see :func:`lambda_max_bound`).
    eps : float
        Ridge added to the diagonal; ``lambda_min >= eps`` always.

    Returns
    -------
    SpectralBounds
        ``lambda_min`` (an estimate, at least eps) and ``lambda_max`` (from above).

    Examples
    --------
    >>> import numpy as np, matroot
    >>> b = matroot.spectral_bounds(np.diag([1.0, 4.0]), eps=1.0)
    >>> round(float(b.lambda_min), 2), round(float(b.lambda_max), 2)
    (2.0, 5.0)
    """
    xp = check_stack(a)
    check_choice(scaling, "scaling", SCALINGS)
    eps = check_nonnegative(eps, "eps")
    reg = _xp.add_scaled_identity(a, xp.full(a.shape[:-2], eps, dtype=a.dtype,
                                             device=_xp.device_of(a)))
    upper = lambda_max_bound_core(reg, scaling=scaling)
    lower = xp.maximum(lambda_min_estimate_core(reg, upper), xp.full_like(upper, eps))
    return SpectralBounds(lower, upper)
