"""Per-step odd quintics for the polar factor: the Polar Express composition.

Every step of a polar iteration maps each singular value σ of the iterate through
an odd quintic ``f(σ) = c1·σ + c3·σ³ + c5·σ⁵`` (``X ← X·(c1·I + c3·A + c5·A²)``
with ``A = XᵀX``); the polar factor is reached when every σ is 1. Polar Express
(Amsel, Persson, Musco & Gower, arXiv 2505.16932) chooses, at each step, the
minimax quintic approximation of 1 on the interval ``[lo, hi]`` known to hold
every σ; for odd polynomials this greedy choice is also optimal for the whole
composition. Two practical changes from the paper carry over:

- a **cushion**: each step is designed on ``[max(lo, CUSHION·top), top]``, so
  no polynomial is steeper than the one for a ratio of 0.024 (steep early
  polynomials amplify rounding). Singular values below the cushion still grow
  (the quintic increases on ``[0, cushion]``): the interval's true bottom is
  carried on as ``f(lo)``;
- a **safety factor**: each step is designed on ``[·, hi·(1 + margin)]``, so a
  σ pushed slightly above ``hi`` by rounding (16-bit operands) stays where the
  polynomial is bounded. The paper multiplies by 1.01 for bfloat16.

The interval after a step is exact in real arithmetic: on the design interval
``f`` stays within ``1 ± E`` (E its minimax error); below it ``f`` increases
from ``f(lo)``. Once ``lo/top`` is too close to 1 for a Remez exchange the
schedule uses :data:`~matroot.solvers.minimax_coefficients.TAIL`, which is
monotone (``f'(σ) = 15(1 − σ²)²/8 ≥ 0``) with a triple fixed point at 1.

The classical Muon quintic (``3.4445, −4.7750, 2.0315``, five steps from a
Frobenius normalisation) is :data:`MUON_QUINTIC`: it maps singular values into
roughly ``[0.7, 1.2]`` by design, trading accuracy for speed.

**Few steps.** A schedule built for ``[ℓ, 1]`` spends its first steps lifting
the smallest σ (no step's slope at 0 exceeds about 8, so ``log₈(1/ℓ)`` steps
pass before anything is near 1), and its first k steps are the best k-step
composition for ``[ℓ, 1]`` only in the max-norm. With a budget of k steps the
useful ℓ is the smallest one the k steps bring within a band of 1:
:func:`band_lower`. Muon's band is :data:`MUON_BAND`; 4 steps (12 products)
bring σ/s ∈ ``[MUON_LOWER, 1]`` (s the σmax bound, within ``n^(1/8)`` of σmax:
:func:`matroot.polar_factor.api.sigma_bound_looseness`) into ``[0.8, 1.2]``, where the
quintic's 5 steps (15 products) bring σ/‖G‖_F ∈ ``[1.5e-3, 1]`` into
``[0.68, 1.2]``: a narrower band, on a wider interval whenever ``‖G‖_F ≥ 2.3·s``
(stable rank above about 5).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..minimax_coefficients import TAIL, quintic_sign_minimax

__all__ = ["CUSHION", "MUON_BAND", "MUON_LOWER", "MUON_POLAR_STEPS", "MUON_QUINTIC",
           "MUON_STEPS", "PolarSchedule", "band_lower", "default_margin", "polar_schedule",
           "quintic_interval"]

#: Lowest ``design bottom / top`` of any step (the paper's default, ≈ 0.024).
CUSHION = 0.02407327424182761
#: Keller Jordan's Muon quintic ``(c1, c3, c5)``, applied ``MUON_STEPS`` times.
MUON_QUINTIC = (3.4445, -4.7750, 2.0315)
MUON_STEPS = 5
#: The quintic's band: its 5 steps map every σ/‖G‖_F in ``[1.5e-3, 1]`` into
#: ``[0.68, 1.2]``, so Muon trains with singular values within about 0.2-0.3 of 1.
MUON_BAND = 0.2
#: Polar Express steps of Muon's default (:class:`matroot.optim.muon.core.MuonConfig`).
MUON_POLAR_STEPS = 4
#: ``band_lower(MUON_POLAR_STEPS)`` (3.21e-3) rounded up: the 4-step schedule for
#: it maps ``[MUON_LOWER, 1]`` within ``MUON_BAND`` of 1 (tests/polar/test_polar.py).
MUON_LOWER = 3.3e-3
#: Ratios ``lo/top`` above this use the tail quintic (Remez is ill-posed near 1).
_NARROWEST = 1.0 - 1e-4
#: No schedule is longer than this (a lower bound of 1e-16 needs about 14 steps).
_MOST_STEPS = 40


class PolarSchedule(NamedTuple):
    """``coefficients[k] = (c1, c3, c5)`` of step k; after step k every singular
    value in ``[lower, 1]`` lies in ``[bottoms[k], tops[k]]`` (real arithmetic)."""

    coefficients: np.ndarray
    bottoms: np.ndarray
    tops: np.ndarray

    @property
    def errors(self) -> np.ndarray:
        """``max |1 − σ|`` after each step."""
        return np.maximum(1.0 - self.bottoms, self.tops - 1.0)


def quintic_interval(coefficients, lo: float, hi: float, *, grid: int = 2049):
    """Where an odd quintic maps ``[lo, hi]``: ``(min f, max f)`` on a dense grid
    plus the ends. For checks and for the fixed Muon quintic, which is not monotone.

    Examples
    --------
    >>> from matroot.solvers.polar.coefficients import MUON_QUINTIC, quintic_interval
    >>> low, high = quintic_interval(MUON_QUINTIC, 0.7, 1.0)
    >>> bool(0.6 < low < 0.75 and 1.1 < high < 1.2)
    True
    """
    c1, c3, c5 = coefficients
    s = np.linspace(lo, hi, grid)
    f = s * (c1 + s * s * (c3 + c5 * s * s))
    return float(f.min()), float(f.max())


def _composition(lower: float, margin: float):
    """Yield ``(row, lo, hi)`` for each Polar Express step of ``[lower, 1]`` (at most
    ``_MOST_STEPS``): the step's quintic and the interval it maps ``[lower, 1]`` into."""
    lo, hi = lower, 1.0
    for _ in range(_MOST_STEPS):
        top = hi * (1.0 + margin)
        design = max(lo, CUSHION * top)
        if design / top < _NARROWEST:
            (c1, c3, c5), error = quintic_sign_minimax(design / top)
            row = (float(c1 / top), float(c3 / top ** 3), float(c5 / top ** 5))
            low_end = lo * (row[0] + lo * lo * (row[1] + row[2] * lo * lo))
            lo, hi = min(low_end, 1.0 - error), 1.0 + error
        else:
            row = TAIL
            lo, hi = quintic_interval(row, lo, hi, grid=2)
        yield row, lo, hi


@functools.lru_cache(maxsize=256)
def polar_schedule(lower: float, target: float, margin: float) -> PolarSchedule:
    """The Polar Express steps taking ``[lower, 1]`` to within ``target`` of 1.

    Parameters
    ----------
    lower : float
        Lower bound on the scaled singular values σ/σmax_bound, in (0, 1).
    target : float
        Stop once every σ of ``[lower, 1]`` is within this of 1 (real
        arithmetic), or after 40 steps.
    margin : float
        Relative headroom above the top of every interval (the safety factor
        minus one): 0.01 for 16-bit operands, about ``√u`` otherwise.

    Returns
    -------
    PolarSchedule
        Read-only arrays of shape (K, 3), (K,), (K,).

    Examples
    --------
    >>> from matroot.solvers.polar.coefficients import polar_schedule
    >>> sch = polar_schedule(1e-3, 1e-6, 1e-3)
    >>> len(sch.coefficients), bool(sch.errors[-1] <= 1e-6)
    (7, True)
    """
    if not 0.0 < lower < 1.0:
        raise ValueError(f"lower must lie in (0, 1), got {lower}")
    rows: list[tuple[float, float, float]] = []
    bottoms: list[float] = []
    tops: list[float] = []
    error = 1.0 - lower
    for row, lo, hi in _composition(lower, margin):
        if error <= target:
            break
        error = max(1.0 - lo, hi - 1.0)
        rows.append(row)
        bottoms.append(lo)
        tops.append(hi)
    schedule = PolarSchedule(np.array(rows, dtype=np.float64).reshape(-1, 3),
                             np.array(bottoms, dtype=np.float64),
                             np.array(tops, dtype=np.float64))
    for array in schedule:
        array.flags.writeable = False
    return schedule


def default_margin(unit_roundoff: float) -> float:
    """The safety margin for operands rounded to ``unit_roundoff``: the paper's 1.01
    for 16-bit operands, ``√u`` (with a 1e-6 floor) for float32 and float64.

    Examples
    --------
    >>> from matroot.solvers.polar.coefficients import default_margin
    >>> default_margin(2.0 ** -8), round(default_margin(2.0 ** -24), 6), default_margin(2.0 ** -53)
    (0.01, 0.000244, 1e-06)
    """
    return 0.01 if unit_roundoff > 1e-4 else max(math.sqrt(unit_roundoff), 1e-6)


@functools.lru_cache(maxsize=64)
def band_lower(steps: int, band: float = MUON_BAND, margin: float = 0.01) -> float:
    """The smallest ℓ whose first ``steps`` Polar Express steps map ``[ℓ, 1]`` within
    ``band`` of 1 (real arithmetic), to 1 % (bisection in log ℓ, rounded up).

    Parameters
    ----------
    steps : int
        The step budget (three products each).
    band : float
        Largest ``|σ − 1|`` allowed after the last step, in (0, 1).
    margin : float
        The safety margin of the schedule (:func:`default_margin`); the 16-bit one
        by default, which gives a slightly larger ℓ that serves every precision.

    Examples
    --------
    >>> from matroot.solvers.polar.coefficients import MUON_LOWER, band_lower
    >>> lower = band_lower(4)
    >>> bool(3e-3 < lower <= MUON_LOWER)
    True
    """
    if steps < 1 or not 0.0 < band < 1.0:
        raise ValueError(f"need steps >= 1 and 0 < band < 1, got {steps}, {band}")

    def reaches(lower: float) -> bool:
        for k, (_, lo, hi) in enumerate(_composition(lower, margin), start=1):
            if k == steps:
                return max(1.0 - lo, hi - 1.0) <= band
        return True

    below, above = math.log(1e-15), math.log(0.5)
    if not reaches(math.exp(above)):
        raise ValueError(f"{steps} steps do not bring [0.5, 1] within {band} of 1")
    while above - below > 0.01:
        middle = (below + above) / 2
        below, above = (below, middle) if reaches(math.exp(middle)) else (middle, above)
    return math.exp(above)
