"""Spectral bounds for stacks of symmetric matrices: the λmax bound that scales the
spectrum into (0, 1], and the λmin estimate and interval the solvers start from.

The iterative solvers converge only when the scaled spectrum lies in their basin,
and spend their iterations on the smallest scaled eigenvalues. A λmax bound close
from above keeps both in check: by default (``bound_certificate="cholesky"``, the
same default as :func:`matroot.inv_root`'s) a power estimate proven by a Cholesky
test, or, with ``"randomized"``, a Lanczos run's largest Ritz value with a margin
that makes it an upper bound except with probability 1e-12 per matrix (both in
:mod:`matroot.spectrum.lambda_max_bounds`); the Frobenius norm is a
guaranteed but loose upper bound (up to √n·λmax) that pushes small eigenvalues
towards 0. Lower estimates of λmin (for Chebyshev's interval and the minimax
schedule when no ridge gives one) come from the same kind of Lanczos run
(:mod:`matroot.spectrum.krylov`) with a safety factor.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import _xp
from .._checks import SCALINGS, check_choice, check_nonnegative, check_stack
from .._typing import Array
from .krylov import (LANCZOS_STEPS, POWER_MATVECS, RitzValues, _entry_scale,  # noqa: F401
                     _start_vectors, lanczos_ritz_extremes, lanczos_ritz_extremes_core,
                     power_iteration, power_iteration_core, ritz_values)
from .lambda_max_bounds import (BOUND_CERTIFICATES, CERTIFY_FACTORS,  # noqa: F401
                                DEFAULT_BOUND_CERTIFICATE, FAILURE_PROBABILITY,
                                POWER_SAFETY, CertifiedBound,
                                certified_lambda_max, randomized_lambda_max,
                                schatten_lambda_max, verified_upper)

__all__ = ["power_iteration", "lambda_max_bound", "certified_lambda_max", "verified_upper",
           "CertifiedBound", "randomized_lambda_max", "lambda_min_estimate",
           "lanczos_ritz_extremes", "RitzValues", "ritz_values", "SpectralBounds",
           "spectral_bounds", "BOUND_CERTIFICATES", "FAILURE_PROBABILITY"]

#: Divisor that turns the smallest Ritz value (≥ λmin) into a lower-bound estimate.
LANCZOS_SAFETY = 4.0


def lambda_max_bound(a: Array, /, *, scaling: str = "power",
                     safety: float = POWER_SAFETY,
                     bound_certificate: str = DEFAULT_BOUND_CERTIFICATE) -> Array:
    """An upper bound on λmax, used to scale the spectrum into (0, 1].

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive semidefinite matrices.
    scaling : {"power", "frobenius"}
        ``"power"``: a Krylov estimate made an upper bound as
        ``bound_certificate`` says, capped by the ∞-norm and Frobenius bounds.
        ``"frobenius"``: ‖A‖_F (never below λmax, up to √n·λmax).
    safety : float
        Factor on the power-iteration estimate (``bound_certificate="cholesky"``).
    bound_certificate : {"cholesky", "randomized"}
        The default is :func:`matroot.inv_root`'s (one default everywhere).
        ``"randomized"``: a 64-step Lanczos run's largest Ritz value with the
        margin of :func:`matroot.spectrum.lambda_max_bounds.randomized_lambda_max`, below
        λmax with probability at most 1e-12 per matrix (none for n ≤ 64), O(n²)
        work per step. ``"cholesky"``: the power estimate times ``safety``, proven
        by a Cholesky test (:func:`certified_lambda_max`, n³/3 flops per test).

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
    >>> float(matroot.lambda_max_bound(a, bound_certificate="randomized"))  # n ≤ 64: exact
    5.000000000000...
    >>> 5.0 <= float(matroot.lambda_max_bound(a)) <= 5.0 * 1.05  # proven by a Cholesky test
    True
    """
    check_stack(a)
    check_choice(scaling, "scaling", SCALINGS)
    check_choice(bound_certificate, "bound_certificate", BOUND_CERTIFICATES)
    safety = check_nonnegative(safety, "safety")
    return _xp.one_program(lambda_max_bound_core, a, dict(safety=safety), scaling=scaling,
                           bound_certificate=bound_certificate)


def lambda_max_bound_core(a: Array, *, scaling: str = "power",
                          safety: float = POWER_SAFETY,
                          bound_certificate: str = DEFAULT_BOUND_CERTIFICATE,
                          ritz: RitzValues | None = None) -> Array:
    """:func:`lambda_max_bound` without input validation, for callers that checked it;
    ``ritz``: the caller's :func:`ritz_values` of ``a`` (randomized bound only)."""
    xp = _xp.array_namespace(a)
    if scaling in ("frobenius", "schatten"):
        scale = _entry_scale(xp, a)
        if scaling == "frobenius":
            return _xp.frobenius_norm(a / scale[..., None, None]) * scale
        n = a.shape[-1]
        flat = xp.reshape(a / scale[..., None, None], (-1, n, n))
        return xp.reshape(schatten_lambda_max(flat), scale.shape) * scale
    batch = tuple(a.shape[:-2])
    n = a.shape[-1]
    if n == 0 or 0 in batch:
        return xp.zeros(batch, dtype=a.dtype, device=_xp.device_of(a))
    flat = xp.reshape(a, (math.prod(batch), n, n))
    if bound_certificate == "cholesky":
        bound = certified_lambda_max(flat, safety=safety).bound
    else:
        bound = randomized_lambda_max(flat, ritz=ritz).bound
    return xp.reshape(bound, batch)


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


def spectral_bounds(a: Array, /, *, scaling: str = "power", eps: float = 0.0,
                    bound_certificate: str = DEFAULT_BOUND_CERTIFICATE) -> SpectralBounds:
    """Estimate the spectral interval of ``A + eps·I`` for every matrix of a stack.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive semidefinite matrices.
    scaling : {"power", "frobenius"}
        How λmax is bounded (see :func:`lambda_max_bound`).
    eps : float
        Ridge added to the diagonal; ``lambda_min >= eps`` always.
    bound_certificate : {"cholesky", "randomized"}
        How the λmax bound is made one (see :func:`lambda_max_bound`).

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
    check_stack(a)
    check_choice(scaling, "scaling", SCALINGS)
    eps = check_nonnegative(eps, "eps")
    check_choice(bound_certificate, "bound_certificate", BOUND_CERTIFICATES)
    return _xp.one_program(_spectral_bounds, a, dict(eps=eps), scaling=scaling,
                           bound_certificate=bound_certificate)


def _spectral_bounds(a: Array, *, eps, scaling: str, bound_certificate: str) -> SpectralBounds:
    xp = _xp.array_namespace(a)
    reg = _xp.add_scaled_identity(a, xp.full(a.shape[:-2], eps, dtype=a.dtype,
                                             device=_xp.device_of(a)))
    # One Lanczos run serves both ends.
    ritz = ritz_values(reg)
    upper = lambda_max_bound_core(reg, scaling=scaling, bound_certificate=bound_certificate,
                                  ritz=ritz)
    lower = xp.maximum(lambda_min_estimate_core(reg, upper, ritz=ritz),
                       xp.full_like(upper, eps))
    return SpectralBounds(lower, upper)
