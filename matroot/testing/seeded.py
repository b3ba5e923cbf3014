"""Stacks rebuilt from one integer seed, shaped like what a benchmark or an optimizer meets.

:func:`matroot.testing.spd_stack` draws from a generator the caller holds and returns
the eigendecomposition with the stack; the functions here take a seed, so that a
result file can name each stack by the number that rebuilds it, and return the
stack alone. :func:`scaled_spd_stack` gives every matrix its own scale (a solver's
λmax bound then has work to do); :func:`shampoo_factors` sums low-rank gradient
products the way a Shampoo preconditioner does.

Examples
--------
>>> import numpy as np
>>> from matroot.testing import SPDCase, shampoo_factors
>>> case = SPDCase(shampoo_factors(3, 8, seed=0), 1e-3, "shampoo_factors")
>>> case.inv_root(4).shape
(3, 8, 8)
"""

from __future__ import annotations

import math

import numpy as np

from .oracle import symmetric_from_eigenpairs
from .spectra import bulk_spectrum, random_orthogonal, spectrum

__all__ = [
    "ENERGY_RANGE",
    "GRADIENT_RANKS",
    "SCALED_SPREADS",
    "SHAMPOO_STEPS",
    "scaled_spd_stack",
    "shampoo_factors",
]

#: The spectra :func:`scaled_spd_stack` offers.
SCALED_SPREADS = ("geometric", "bulk")
#: Ranks of the per-step gradients of :func:`shampoo_factors`, cycled over the blocks.
GRADIENT_RANKS = (1, 2, 4, 8, 16)
#: Preconditioner updates summed into each Shampoo factor.
SHAMPOO_STEPS = 4
#: The blocks' total gradient energy (trace of L) is log-spaced over this range.
ENERGY_RANGE = (1.0, 1e-3)


def scaled_spd_stack(batch: int, n: int, kappa: float, *, seed: int = 0,
                     dtype=np.float32, spread: str = "geometric") -> np.ndarray:
    """A ``(batch, n, n)`` stack of random SPD matrices with condition number ``kappa``.

    Matrix ``i`` is ``Q_i diag(s_i·λ) Q_iᵀ`` with a Haar-random orthogonal ``Q_i``,
    the eigenvalues ``λ`` of ``spread`` (the ``"geometric"`` family, or
    :func:`~matroot.testing.spectra.bulk_spectrum` for ``"bulk"``) and a scale
    ``s_i`` drawn log-uniformly from [0.1, 10]. Built in float64, then rounded to
    ``dtype``.

    Raises
    ------
    ValueError
        For ``batch`` or ``n`` below 1, ``kappa`` below 1 or infinite, or an unknown
        ``spread``.
    TypeError
        For a ``dtype`` that is not real floating.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.testing import scaled_spd_stack
    >>> a = scaled_spd_stack(2, 16, 1e3, seed=1, dtype=np.float64)
    >>> w = np.linalg.eigvalsh(a)
    >>> bool(np.allclose(w[:, -1] / w[:, 0], 1e3))
    True
    """
    if n < 1 or batch < 1:
        raise ValueError(f"n and batch must be >= 1, got n={n}, batch={batch}")
    if not 1 <= kappa < math.inf:
        raise ValueError(f"kappa must be >= 1 and finite, got {kappa}")
    if np.dtype(dtype).kind != "f":
        raise TypeError(f"dtype={np.dtype(dtype)} is not a real floating dtype: an SPD "
                        "stack cast to it would lose its values; pass np.float32 or np.float64")
    if spread not in SCALED_SPREADS:
        raise ValueError(f"spread {spread!r} is not one of {SCALED_SPREADS}")
    rng = np.random.default_rng(seed)
    lam = bulk_spectrum(n, kappa) if spread == "bulk" else spectrum(spread, rng, (), n, kappa)
    # Largest first, and each matrix's rotation drawn before its scale: the order the
    # committed benchmark results' seeds were drawn in, so they rebuild the same stacks.
    lam = lam[::-1]
    q = np.empty((batch, n, n))
    scales = np.empty((batch, 1))
    for i in range(batch):
        q[i] = random_orthogonal(rng, (), n)
        scales[i] = 10.0 ** rng.uniform(-1, 1)
    return symmetric_from_eigenpairs(q, scales * lam).astype(dtype)


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
    >>> from matroot.testing import shampoo_factors
    >>> np.trace(shampoo_factors(3, 8), axis1=1, axis2=2).round(6).tolist()
    [1.0, 0.031623, 0.001]
    """
    if n < 1 or batch < 1:
        raise ValueError(f"n and batch must be >= 1, got n={n}, batch={batch}")
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
