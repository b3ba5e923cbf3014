"""Rectangular stacks with a known polar factor, and the float64 SVD oracle.

NumPy only (no hypothesis): :func:`polar_case` builds ``G = U·diag(σ)·Vᵀ`` from
random orthogonal factors and a chosen singular spectrum, so the exact polar
factor ``U·Vᵀ`` is known; :func:`oracle_polar` computes it from any array by a
float64 SVD.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..polar_accuracy import polar_error_bound
from .oracle import host_float64
from .spectra import random_orthogonal

__all__ = ["PolarCase", "polar_case", "oracle_polar", "polar_relative_error",
           "polar_error_bound"]


class PolarCase(NamedTuple):
    """A float64 stack ``g`` (batch, m, n), its exact polar factor and its κ."""

    g: np.ndarray
    polar: np.ndarray
    kappa: float


def polar_case(rng: np.random.Generator, batch: tuple, m: int, n: int, kappa: float,
               *, scale: float = 1.0) -> PolarCase:
    """A stack whose singular values are log-spaced on ``[scale/κ, scale]``.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.testing.polar_oracle import polar_case
    >>> case = polar_case(np.random.default_rng(0), (2,), 5, 3, 100.0)
    >>> case.g.shape, round(float(np.linalg.cond(case.g[0])), 6)
    ((2, 5, 3), 100.0)
    """
    k = min(m, n)
    u = random_orthogonal(rng, batch, m)[..., :k]
    v = random_orthogonal(rng, batch, n)[..., :k]
    sigma = scale * np.logspace(0.0, -np.log10(kappa), k) if k > 1 else np.full(k, scale)
    vt = np.swapaxes(v, -1, -2)
    return PolarCase((u * sigma) @ vt, u @ vt, float(kappa))


def oracle_polar(g) -> np.ndarray:
    """``U·Vᵀ`` of any backend's stack by a float64 SVD (singular values at or below
    ``min(m, n)·2⁻⁵³·σmax`` map to zero, as matroot's methods map them)."""
    x = host_float64(g)
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    significant = s > min(x.shape[-2:]) * 2.0 ** -53 * s[..., :1]
    return (u * significant[..., None, :]) @ vt


def polar_relative_error(q, reference) -> np.ndarray:
    """Per matrix ``‖Q − P‖_F/√min(m, n)`` (``‖P‖_F`` for an orthogonal P)."""
    q = host_float64(q)
    return np.linalg.norm(q - reference, axis=(-2, -1)) / np.sqrt(min(q.shape[-2:]))
