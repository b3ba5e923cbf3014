"""Three odd quintics fitted to the RMS orthogonality defect: 9 products at κ ≤ 100.

The orthogonality defect ``‖QᵀQ − I‖_F/√n`` of ``Q = p(X)`` is the RMS of
``p(σ)² − 1`` over the singular values, not their worst case. Polar Express
(:mod:`.coefficients`) minimises the worst case on ``[ℓ, 1]``, which 3 steps
cannot bring near 1 for ℓ = 1e-2 (its 3 steps leave a defect of 0.31-0.33 at
κ = 100). :data:`FITTED_QUINTICS` instead minimises the largest RMS of
``p(σ)² − 1`` over log-uniform spectra ``σ/σmax ∈ [1/κ, 1]``,
κ ∈ :data:`FITTED_KAPPAS`, each seen through a σmax bound up to
:data:`FITTED_LOOSENESS` above σmax (:func:`fit_objective`), under three
constraints that keep it a polar iteration (:func:`step_tops`):

- every partial composition is **positive** on ``(0, top]`` (no sign flip: a
  negative ``p(σ)`` would flip that singular direction, which no polar factor
  does; then ``|p(σ) − 1| ≤ |p(σ)² − 1|`` and the error against the exact factor
  stays below the defect);
- each step's interval carries the 16-bit safety margin (``top·1.01``) so a σ
  pushed above the top by operand rounding stays where the step is positive;
- the composition never exceeds :data:`FITTED_CAP`.

No pointwise guarantee is possible in 3 quintic steps: the composition best in the
max norm (Polar Express's greedy one, without cushion) leaves ``max |p(σ) − 1| = 0.27``
on ``[1e-2, 1]``, so some σ there keeps ``|p² − 1| ≥ 0.47``, and a spectrum piled
there keeps that defect (this composition maps 1e-2 to 0.54). The fit serves spectra
spread over ``[1e-2, 1]`` (docs/polar.rst gives where it holds and where not).

The constants are the output of ``python -m bench polar_fit`` (Nelder-Mead then
Powell from the Polar Express rows, deterministic); ``tests/polar/test_polar_fitted.py``
re-derives them (slow) and checks the constraints exactly.
"""

from __future__ import annotations

import math

import numpy as np

from .coefficients import polar_schedule

__all__ = ["FITTED_CAP", "FITTED_KAPPAS", "FITTED_LOOSENESS", "FITTED_LOWER", "FITTED_MARGIN",
           "FITTED_QUINTICS", "FITTED_RMS", "fit_objective", "fitted_steps", "rms_defect",
           "step_tops"]

#: The smallest σmin/σmax the fit serves and the spectra it is fitted on.
FITTED_LOWER = 1e-2
FITTED_KAPPAS = (10.0, 30.0, 100.0)
#: The fit holds for σmax bounds ``s ∈ [σmax, FITTED_LOOSENESS·σmax]``: the Cholesky
#: bound's (≤ 1.025·σmax where its power estimate is good), the Gram-norm bound's where
#: ``Σ(σ/σmax)⁸ ≤ 1.2⁸ ≈ 4.3``.
FITTED_LOOSENESS = 1.2
#: Largest value of the composition on ``[0, 1]``.
FITTED_CAP = 1.35
#: The interval margin of every step (the 16-bit one of :func:`.coefficients.default_margin`).
FITTED_MARGIN = 0.01
#: ``(c1, c3, c5)`` of each step, from ``python -m bench polar_fit``.
FITTED_QUINTICS = (
    (6.568885607145405, -18.510763938426123, 13.342709860372667),
    (3.6519019386424882, -3.703728879294883, 1.035069510218902),
    (2.3785242745573183, -1.8573933216588534, 0.5074065804366414),
)
#: :func:`fit_objective` of :data:`FITTED_QUINTICS` (the largest fitted RMS defect).
FITTED_RMS = 0.278694

#: Points of each fitted spectrum and of each looseness range.
_SPECTRUM_POINTS, _LOOSENESS_POINTS = 256, 5
#: Weight of the constraint penalties in :func:`fit_objective`.
_PENALTY = 1e4


def _apply(rows, sigma):
    for c1, c3, c5 in rows:
        square = sigma * sigma
        sigma = sigma * (c1 + square * (c3 + c5 * square))
    return sigma


def rms_defect(rows, sigma) -> np.ndarray:
    """RMS of ``p(σ)² − 1`` along the last axis of ``sigma``: the orthogonality defect
    ``‖QᵀQ − I‖_F/√n`` that the composition ``p`` of ``rows`` leaves in real arithmetic.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.solvers.polar.fitted import FITTED_QUINTICS, rms_defect
    >>> float(rms_defect(FITTED_QUINTICS, np.logspace(0, -2, 64))) < 0.25
    True
    """
    p = _apply(rows, np.asarray(sigma, dtype=np.float64))
    return np.sqrt(np.mean((p * p - 1.0) ** 2, axis=-1))


def _extrema(row, lo: float, hi: float) -> tuple[float, float, float]:
    """``(min q, min f, max f)`` of ``f(y) = y·q(y²)``, ``q(t) = c1 + c3·t + c5·t²``,
    on ``[lo, hi]`` (``q`` over ``t ∈ [lo², hi²]``): exact, from the critical points."""
    c1, c3, c5 = row
    t_lo, t_hi = lo * lo, hi * hi

    def inside(ts):
        return [t for t in ts if t_lo < t < t_hi]

    q_points = [t_lo, t_hi] + (inside([-c3 / (2 * c5)]) if c5 != 0 else [])
    q_min = min(c1 + t * (c3 + c5 * t) for t in q_points)
    # f'(y) = c1 + 3·c3·t + 5·c5·t² with t = y².
    disc = 9 * c3 * c3 - 20 * c5 * c1
    roots = ([(-3 * c3 + sign * math.sqrt(disc)) / (10 * c5) for sign in (-1, 1)]
             if c5 != 0 and disc >= 0 else [])
    ys = [lo, hi] + [math.sqrt(t) for t in inside(roots)]
    values = [y * (c1 + y * y * (c3 + c5 * y * y)) for y in ys]
    return q_min, min(values), max(values)


def step_tops(rows, margin: float = FITTED_MARGIN) -> tuple[float, list[float]]:
    """The smallest ``q_k`` of any step on its interval and the top after each step.

    Step k acts on ``[0, top_{k−1}·(1 + margin)]`` (``top_0 = 1``); it is positive
    there (every partial composition positive on ``(0, 1]``, with room for rounding)
    iff its ``q_k(σ²) = c1 + c3·σ² + c5·σ⁴`` is, and ``top_k`` is its maximum there.

    Examples
    --------
    >>> from matroot.solvers.polar.fitted import FITTED_CAP, FITTED_QUINTICS, step_tops
    >>> q_min, tops = step_tops(FITTED_QUINTICS)
    >>> bool(q_min > 0 and tops[-1] <= FITTED_CAP * (1 + 1e-5))
    True
    """
    top, tops, q_least = 1.0, [], math.inf
    for row in rows:
        q_min, _, top = _extrema(row, 0.0, top * (1.0 + margin))
        q_least = min(q_least, q_min)
        tops.append(top)
    return q_least, tops


def fit_objective(flat) -> float:
    """What ``python -m bench polar_fit`` minimises over the 9 coefficients ``flat``:
    the largest RMS defect over κ ∈ :data:`FITTED_KAPPAS` and σmax bounds
    ``[1, FITTED_LOOSENESS]·σmax``, plus penalties for a negative ``q_k`` and a top
    above :data:`FITTED_CAP` (both exact, :func:`step_tops`)."""
    rows = np.asarray(flat, dtype=np.float64).reshape(-1, 3)
    spectra = np.array([np.logspace(0.0, -math.log10(k), _SPECTRUM_POINTS)
                        for k in FITTED_KAPPAS])
    scales = np.linspace(1.0, FITTED_LOOSENESS, _LOOSENESS_POINTS)
    worst = float(rms_defect(rows, spectra[:, None, :] / scales[None, :, None]).max())
    q_min, tops = step_tops(rows)
    penalty = min(q_min, 0.0) ** 2 + max(tops[-1] - FITTED_CAP, 0.0) ** 2
    return worst + _PENALTY * penalty


def _interval(rows, lower: float) -> tuple[float, float]:
    """Where the composition of ``rows`` maps ``[lower, 1]`` (real arithmetic)."""
    lo, hi = lower, 1.0
    for row in rows:
        _, lo, hi = _extrema(row, lo, hi)
    return lo, hi


def fitted_steps(lower, target, margin, max_iter):
    """The ``rms_quintic`` rows (registry ``steps``): the fitted quintics (the first
    ``max_iter`` of them), then, for ``max_iter > 3``, Polar Express steps for the
    interval the fitted ones leave ``[lower, 1]`` in, until ``target`` or the cap."""
    count = len(FITTED_QUINTICS) if max_iter is None else max_iter
    rows = FITTED_QUINTICS[:count]
    if count <= len(FITTED_QUINTICS):
        return rows
    lo, hi = _interval(FITTED_QUINTICS, lower)
    tail = polar_schedule(min(lo / hi, 0.5), target, margin).coefficients[:count - len(rows)]
    if len(tail) == 0:
        return rows
    # The tail is built for σ/hi ∈ [lo/hi, 1]: its first step divides by hi.
    (c1, c3, c5), rest = tail[0], tail[1:]
    first = (float(c1 / hi), float(c3 / hi ** 3), float(c5 / hi ** 5))
    return (*rows, first, *(tuple(float(c) for c in row) for row in rest))
