"""Norm bounds from Gaussian probes: ``‖B‖`` from ``B·Ω`` alone, failing with a stated probability.

For a matrix ``B`` (only its products with vectors needed) and ``r`` independent
standard Gaussian vectors ``ω_i``:

- spectral norm (Halko, Martinsson & Tropp 2011, §4.3, Lemma 4.1):
  ``‖B‖₂ ≤ α·√(2/π)·max_i ‖B·ω_i‖`` fails with probability at most ``α^(−r)``;
- Frobenius norm: ``‖B‖_F² ≤ mean_i ‖B·ω_i‖² / x`` fails with probability at most
  ``(x·e^(1−x))^(r/2)`` for ``0 < x < 1``. Proof: by rotation invariance
  ``‖B·ω‖² = Σ_j σ_j² g_j²`` with independent standard normal ``g_j``, so for
  ``t ≥ 0``, ``E exp(−t·Σ_i‖B·ω_i‖²) = Π_j (1 + 2tσ_j²)^(−r/2) ≤ (1 + 2t‖B‖_F²)^(−r/2)``
  (expand the product; every term is ≥ 0). Markov's inequality on
  ``exp(−t·Σ)`` and the best ``t = (1/x − 1)/(2‖B‖_F²)`` give the bound. The worst
  case is a rank-one ``B``, for which it is within a constant of exact.

The failure probability is over the draw of the probes, for a ``B`` that does not
depend on them. The probes come from a fixed seed (:data:`PROBE_SEED`), so a call
is reproducible; an input built to defeat that one draw is outside the statement.
Each bound here is allowed :data:`FAILURE_PROBABILITY` / :data:`BOUNDS_PER_CHECK`,
so the check that uses all of them fails with probability at most
:data:`FAILURE_PROBABILITY` per matrix (union bound).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import _xp

__all__ = ["BOUNDS_PER_CHECK", "FAILURE_PROBABILITY", "FROBENIUS_FACTOR", "PROBES",
           "PROBE_SEED", "SPECTRAL_FACTOR", "frobenius_factor", "probe_block",
           "spectral_factor"]

#: Probability, per matrix, that a randomized check reports a bound that is too low.
FAILURE_PROBABILITY = 1e-12
#: Bounds a check draws from one probe block (its residual's spectral and Frobenius
#: norms, and the first-order error's Frobenius norm).
BOUNDS_PER_CHECK = 3
#: Gaussian probe vectors per matrix.
PROBES = 24
#: Seed of the probe block (reproducible calls).
PROBE_SEED = 20111


def spectral_factor(probes: int, failure: float) -> float:
    """``α·√(2/π)`` with ``α^(−probes) = failure``: ``‖B‖₂ ≤`` this ``× max_i ‖B·ω_i‖``.

    Examples
    --------
    >>> from matroot.certify.probes import spectral_factor
    >>> round(spectral_factor(24, 1e-12 / 3), 3)
    2.641
    """
    return failure ** (-1.0 / probes) * math.sqrt(2.0 / math.pi)


@functools.cache
def frobenius_factor(probes: int, failure: float) -> float:
    """``1/√x`` with ``(x·e^(1−x))^(probes/2) = failure``: ``‖B‖_F ≤`` this
    ``× rms_i ‖B·ω_i‖``.

    Examples
    --------
    >>> from matroot.certify.probes import frobenius_factor
    >>> round(frobenius_factor(24, 1e-12 / 3), 3)
    5.364
    """
    level = math.log(failure) * 2.0 / probes  # log of x·e^(1−x), negative
    low, high = 0.0, 1.0  # x·e^(1−x) rises from 0 to 1 on (0, 1)
    for _ in range(200):
        mid = (low + high) / 2
        if math.log(mid) + 1.0 - mid < level:
            low = mid
        else:
            high = mid
    return 1.0 / math.sqrt(low)


#: The factors for the check's share of the failure probability.
SPECTRAL_FACTOR = spectral_factor(PROBES, FAILURE_PROBABILITY / BOUNDS_PER_CHECK)
FROBENIUS_FACTOR = frobenius_factor(PROBES, FAILURE_PROBABILITY / BOUNDS_PER_CHECK)


@functools.cache
def _host_block(n: int, probes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, probes))


def probe_block(xp, n: int, dtype, device, *, probes: int = PROBES, seed: int = PROBE_SEED):
    """An ``(n, probes)`` block of standard Gaussian vectors in ``xp``'s ``dtype`` on ``device``.

    Drawn on the host once per ``(n, probes, seed)``; under ``jax.jit`` it is a
    constant of the compiled program.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.certify.probes import probe_block
    >>> probe_block(np, 5, np.float32, None).shape
    (5, 24)
    """
    return _xp.from_numpy(xp, _host_block(n, probes, seed), dtype=dtype, device=device)
