"""Rectangular stacks with a known polar factor, and the float64 SVD oracle.

NumPy only (no hypothesis): :func:`polar_case` builds ``G = U·diag(σ)·Vᵀ`` from
random orthogonal factors and a chosen singular spectrum, so the exact polar
factor ``U·Vᵀ`` is known; :func:`oracle_polar` computes it from any array by a
float64 SVD.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..certify.polar_accuracy import polar_error_bound
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
    if not 1.0 <= kappa < np.inf or not 0.0 < scale < np.inf:
        raise ValueError(f"kappa={kappa!r}, scale={scale!r}: a condition number is finite "
                         "and >= 1, a scale finite and > 0 (a zero matrix has no "
                         "orthogonal polar factor)")
    k = min(m, n)
    u = random_orthogonal(rng, batch, m)[..., :k]
    v = random_orthogonal(rng, batch, n)[..., :k]
    sigma = scale * np.logspace(0.0, -np.log10(kappa), k) if k > 1 else np.full(k, scale)
    vt = np.swapaxes(v, -1, -2)
    return PolarCase((u * sigma) @ vt, u @ vt, float(kappa))


def oracle_polar(g) -> np.ndarray:
    """``U·Vᵀ`` of any backend's stack by a float64 SVD (singular values at or below
    ``min(m, n)·2⁻⁵³·σmax`` map to zero, as matroot's methods map them), refined once
    where the matrix has full rank.

    A float64 SVD alone is off by about ``u·κ`` (its backward error moves the small
    singular directions): at κ ≈ 5e6 that is as large as the error bound the tests
    hold a converged factor to. One Newton correction, with the residual
    ``G − Q₀H₀`` and ``I − Q₀ᵀQ₀`` formed in long double, leaves about ``(u·κ)²``
    plus long double's rounding (measured against 40-digit mpmath: 7e-10 → 7e-14 at
    κ = 5e6). Where long double is float64 the correction is of rounding noise and
    leaves the SVD's accuracy.
    """
    x = host_float64(g)
    wide = x.shape[-2] < x.shape[-1]
    if wide:
        x = np.swapaxes(x, -1, -2)
    k = x.shape[-1]
    if x.size == 0:
        return np.zeros(g.shape)
    u, s, vt = np.linalg.svd(x, full_matrices=True)
    significant = s > k * 2.0 ** -53 * s[..., :1]
    q = (u[..., :k] * significant[..., None, :]) @ vt
    full_rank = np.all(significant, axis=-1)
    if np.any(full_rank):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            refined = _newton_corrected(x, u, s, vt)
        q = np.where(full_rank[..., None, None], refined, q)
    return np.swapaxes(q, -1, -2) if wide else q


def _newton_corrected(x, u, s, vt):
    """``Q₀ + Q₀·Ω + Q⊥·W`` for a tall full-rank stack ``x = U·diag(s)·Vᵀ``: the first-order
    correction of ``Q₀ = U·Vᵀ``, ``H₀ = V·diag(s)·Vᵀ`` that makes ``(Q₀ + ΔQ)(H₀ + ΔH) = x``
    with ``Q`` orthonormal (``Ω + Ωᵀ = D = I − Q₀ᵀQ₀``) and ``H`` symmetric. The residuals
    are formed in long double; the rest is float64 (a relative error of ``u·κ`` in a
    correction of size ``u·κ``)."""
    k = x.shape[-1]
    v = np.swapaxes(vt, -1, -2)
    q0 = u[..., :k] @ vt
    h0 = (v * s[..., None, :]) @ vt
    h0 = (h0 + np.swapaxes(h0, -1, -2)) / 2
    wide_float = np.longdouble
    r = (x.astype(wide_float) - q0.astype(wide_float) @ h0.astype(wide_float)).astype(np.float64)
    q0t = np.swapaxes(q0, -1, -2)
    d = (np.eye(k, dtype=wide_float) - q0t.astype(wide_float) @ q0.astype(wide_float)
         ).astype(np.float64)
    # Q₀ᵀR = ΔH + Ω·H₀: its skew part is that of S·H₀ (S = Ω − D/2, skew), which the
    # eigenbasis of H₀ diagonalises: S̃_ij·(s_i + s_j)/2.
    m = q0t @ r - (d / 2) @ h0
    skew = vt @ ((m - np.swapaxes(m, -1, -2)) / 2) @ v
    s_part = v @ (2 * skew / (s[..., :, None] + s[..., None, :])) @ vt
    # The part outside Q₀'s range: Q⊥ᵀR = W·H₀.
    q_perp = u[..., k:]
    w = np.swapaxes(q_perp, -1, -2) @ r @ (v / s[..., None, :]) @ vt
    return q0 + q0 @ (d / 2 + s_part) + q_perp @ w


def polar_relative_error(q, reference) -> np.ndarray:
    """Per matrix ``‖Q − P‖_F/√min(m, n)`` (``‖P‖_F`` for an orthogonal P)."""
    q = host_float64(q)
    return np.linalg.norm(q - reference, axis=(-2, -1)) / np.sqrt(min(q.shape[-2:]))
