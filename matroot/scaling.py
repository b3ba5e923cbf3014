"""Spectral bounds for stacks of symmetric matrices.

The iterative solvers converge only when the scaled spectrum lies in their basin,
and spend their iterations on the smallest scaled eigenvalues. A λmax estimate close
from above keeps both in check; the Frobenius norm is a guaranteed but loose upper
bound (up to √n·λmax) that pushes small eigenvalues towards 0.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _xp
from ._checks import SCALINGS, check_choice, check_stack

__all__ = ["power_iteration", "lambda_max_bound", "lambda_min_estimate", "SpectralBounds",
           "spectral_bounds"]

#: Power iteration returns a lower bound on λmax; this margin covers its shortfall.
POWER_SAFETY = 1.05

_START_SEED = 20240607


def _start_vectors(xp, n: int, k: int, dtype, device):
    # A fixed-seed host draw: reproducible, never touches the global RNG, and the
    # same start on every backend so results agree across them.
    rng = np.random.default_rng(_START_SEED + 7919 * n + k)
    v = rng.standard_normal((n, k))
    v /= np.linalg.norm(v, axis=0, keepdims=True)
    return _xp.from_numpy(xp, v, dtype=dtype, device=device)


def _entry_scale(xp, a):
    """Per-matrix max |entry|, with 1 for all-zero matrices (so a / scale is safe)."""
    m = xp.max(xp.abs(a), axis=(-2, -1))
    return xp.where(m > 0, m, xp.ones_like(m))


def power_iteration(a, /, *, num_vectors: int = 4, num_iter: int = 12):
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
    xp = check_stack(a)
    n = a.shape[-1]
    batch = a.shape[:-2]
    if n == 0 or 0 in batch:
        return xp.zeros(batch, dtype=a.dtype, device=_xp.device_of(a))
    scale = _entry_scale(xp, a)
    b = a / scale[..., None, None]
    k = max(1, min(num_vectors, n))
    v = _start_vectors(xp, n, k, a.dtype, _xp.device_of(a))
    v = xp.broadcast_to(v, (*batch, n, k))
    best = xp.zeros(batch, dtype=a.dtype, device=_xp.device_of(a))
    tiny = xp.finfo(a.dtype).smallest_normal
    for _ in range(num_iter):
        w = b @ v
        norms = xp.sqrt(xp.sum(w * w, axis=-2))
        best = xp.maximum(best, xp.max(norms, axis=-1))
        v = w / xp.maximum(norms, tiny)[..., None, :]
    return best * scale


def lambda_max_bound(a, /, *, scaling: str = "power", safety: float = POWER_SAFETY):
    """An estimate of λmax from above, used to scale the spectrum into (0, 1].

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive semidefinite matrices.
    scaling : {"power", "frobenius"}
        ``"power"``: power iteration times ``safety``, capped by the ∞-norm and
        Frobenius bounds (both guaranteed ≥ λmax). ``"frobenius"``: ‖A‖_F.
    safety : float
        Factor on the power-iteration estimate.

    Returns
    -------
    array, shape (...)
        Upper estimates of λmax; 0 only for all-zero matrices.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.diag([1.0, 2.0, 5.0])
    >>> float(matroot.lambda_max_bound(a, scaling="frobenius"))  # doctest: +ELLIPSIS
    5.47...
    """
    xp = check_stack(a)
    check_choice(scaling, "scaling", SCALINGS)
    scale = _entry_scale(xp, a)
    b = a / scale[..., None, None]
    frob = _xp.frobenius_norm(b)
    if scaling == "frobenius":
        return frob * scale
    inf_norm = xp.max(xp.sum(xp.abs(b), axis=-1), axis=-1)
    guaranteed = xp.minimum(frob, inf_norm)
    estimate = power_iteration(b) * safety
    return xp.minimum(estimate, guaranteed) * scale


def lambda_min_estimate(a, /, lambda_max, *, num_iter: int = 30):
    """Estimate λmin by power iteration on ``λmax·I − A``.

    Accurate to about ``eps_dtype · λmax`` in absolute terms, so it resolves λmin
    only for κ well below 1/eps_dtype. Returned values are clipped at 0.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive semidefinite matrices.
    lambda_max : array, shape (...)
        An upper bound on λmax (e.g. from :func:`lambda_max_bound`).
    num_iter : int, optional
        Multiplications by the shifted matrix.

    Returns
    -------
    array, shape (...)

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.diag([1.0, 2.0, 5.0])
    >>> round(float(matroot.lambda_min_estimate(a, np.asarray(5.0))), 2)
    1.0
    """
    xp = check_stack(a)
    shifted = _xp.add_scaled_identity(-a, lambda_max)
    top = power_iteration(shifted, num_iter=num_iter)
    return xp.maximum(lambda_max - top, xp.zeros_like(top))


class SpectralBounds(NamedTuple):
    """Per-matrix spectral interval estimate ``[lambda_min, lambda_max]``."""

    lambda_min: object
    lambda_max: object


def spectral_bounds(a, /, *, scaling: str = "power", eps: float = 0.0):
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
    (2.0, 5.25)
    """
    xp = check_stack(a)
    reg = _xp.add_scaled_identity(a, xp.full(a.shape[:-2], eps, dtype=a.dtype,
                                             device=_xp.device_of(a)))
    upper = lambda_max_bound(reg, scaling=scaling)
    lower = xp.maximum(lambda_min_estimate(reg, upper), xp.full_like(upper, eps))
    return SpectralBounds(lower, upper)
