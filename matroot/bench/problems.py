"""The benchmark's problems: SPD stacks with a known spectral spread, and Shampoo factors.

They are judged by matroot.testing's float64 oracle (:class:`matroot.testing.SPDCase`,
:func:`matroot.testing.relative_error`). The stacks here differ from
:func:`matroot.testing.spd_stack` on purpose: each matrix has its own scale (so the
λmax estimate has work to do) and a ``"bulk"`` spectrum models a Shampoo factor, and
the committed results name each stack by the seed that rebuilds it.
"""

from __future__ import annotations

import math
import numpy as np

__all__ = ["spd_stack", "spectrum", "SPECTRA", "shampoo_factors"]


SPECTRA = ("geometric", "bulk")
#: Ranks of the per-step gradients of :func:`shampoo_factors`, cycled over the blocks.
GRADIENT_RANKS = (1, 2, 4, 8, 16)
#: Preconditioner updates summed into each Shampoo factor.
SHAMPOO_STEPS = 4
#: The blocks' total gradient energy (trace of L) is log-spaced over this range.
ENERGY_RANGE = (1.0, 1e-3)


def spectrum(n: int, kappa: float, kind: str = "geometric") -> np.ndarray:
    """``n`` eigenvalues from 1 down to ``1/kappa``, largest first.

    ``"geometric"`` spaces them evenly in log scale. ``"bulk"`` puts seven
    eighths of them evenly in [1/2, 1] and the rest geometrically from 1/2 to
    1/κ: a dense top with a tail, like a Shampoo factor plus a ridge, whose
    Frobenius norm is about √n/2 times its λmax (for the geometric kind the
    ratio is only about √(n / (2 ln κ))).

    Examples
    --------
    >>> from matroot.bench.problems import spectrum
    >>> spectrum(4, 100.0).round(3).tolist()
    [1.0, 0.215, 0.046, 0.01]
    """
    if kind not in SPECTRA:
        raise ValueError(f"spectrum kind {kind!r} is not one of {SPECTRA}")
    if n == 1:
        return np.ones(1)
    if kind == "geometric":
        return np.geomspace(1.0, 1.0 / kappa, n)
    tail = max(1, n // 8)
    top = np.linspace(1.0, 0.5, n - tail, endpoint=False)
    return np.concatenate([top, np.geomspace(0.5, 1.0 / kappa, tail)])


def spd_stack(n: int, batch: int, kappa: float, *, seed: int = 0,
              dtype=np.float32, kind: str = "geometric") -> np.ndarray:
    """A ``(batch, n, n)`` stack of random SPD matrices with condition number ``kappa``.

    Each matrix is ``Q diag(λ) Qᵀ`` with a Haar-random orthogonal ``Q`` and the
    eigenvalues of :func:`spectrum` (``kind``) times a scale ``s`` drawn
    log-uniformly from [0.1, 10] per matrix (so the solvers' λmax estimate has
    work to do). Built in float64, then rounded to ``dtype``.

    Examples
    --------
    >>> from matroot.bench.problems import spd_stack
    >>> import numpy as np
    >>> a = spd_stack(16, 2, 1e3, seed=1, dtype=np.float64)
    >>> w = np.linalg.eigvalsh(a)
    >>> np.allclose(w[:, -1] / w[:, 0], 1e3)
    True
    """
    if n < 1 or batch < 1:
        raise ValueError(f"n and batch must be >= 1, got n={n}, batch={batch}")
    if not kappa >= 1:
        raise ValueError(f"kappa must be >= 1, got {kappa}")
    rng = np.random.default_rng(seed)
    out = np.empty((batch, n, n))
    lam = spectrum(n, kappa, kind)
    for i in range(batch):
        q, r = np.linalg.qr(rng.standard_normal((n, n)))
        q *= np.sign(np.diag(r))  # Haar measure: fix the signs QR leaves arbitrary.
        scale = 10.0 ** rng.uniform(-1, 1)
        out[i] = (q * (scale * lam)) @ q.T
    out = (out + np.swapaxes(out, -1, -2)) / 2
    return out.astype(dtype)


def shampoo_factors(batch: int, n: int, *, seed: int = 0) -> np.ndarray:
    """Float64 stack of ``batch`` Shampoo factors ``L = Σ_t G_t G_tᵀ`` of size ``n``.

    Block ``i`` sums :data:`SHAMPOO_STEPS` random gradients of rank
    ``GRADIENT_RANKS[i % 5]`` (capped at n); its trace, the block's gradient
    energy, is log-spaced over :data:`ENERGY_RANGE` across the stack, so one
    absolute ridge gives the blocks condition numbers that differ by orders of
    magnitude, as one Shampoo preconditioner update sees them.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.bench.problems import shampoo_factors
    >>> np.trace(shampoo_factors(3, 8), axis1=1, axis2=2).round(6).tolist()
    [1.0, 0.031623, 0.001]
    """
    rng = np.random.default_rng(seed)
    high, low = ENERGY_RANGE
    energies = np.geomspace(high, low, batch) if batch > 1 else np.array([high])
    factors = np.empty((batch, n, n))
    for i, energy in enumerate(energies):
        rank = min(GRADIENT_RANKS[i % len(GRADIENT_RANKS)], n)
        total = np.zeros((n, n))
        for _ in range(SHAMPOO_STEPS):
            g = rng.standard_normal((n, rank)) @ rng.standard_normal((rank, n))
            g *= math.sqrt(energy / SHAMPOO_STEPS) / np.linalg.norm(g)
            total += g @ g.T
        factors[i] = (total + total.T) / 2
    return factors
