"""The fixed-step rule: how many steps a polynomial iteration needs, decided on the host
before the solve, so that the solve itself reads nothing back.

Each coupled iteration moves every eigenvalue of the scaled stack by a known scalar
map, the same for every matrix:

- Newton–Schulz (``newton_db``): ``x ← x·((3 − x)/2)²`` on the eigenvalues ``x`` of
  ``ZY``, from ``x₀ = λ``;
- coupled Newton: ``m ← m·((p + 1 − m)/p)^p`` on the eigenvalues of ``M``, from
  ``m₀ = t·λ`` (``t = (p + 1)/2``);
- minimax: step k's quintic maps the interval ``[1 − e_k, 1 + e_k]`` of
  ``s = √x`` into ``[1 − e_{k+1}, 1 + e_{k+1}]`` (its schedule's errors), then
  the cubic tail map.

So the steps that bring every ``λ`` of ``[lower, 1]`` to a residual ``tol`` are the
steps the smallest ``λ`` needs, found by running the map on the host. ``lower``
needs no read of the stack either: a root is certified at an accuracy target
``rtol`` only where ``CHECK_RESOLUTION·u·κ/p < rtol``
(:func:`matroot.certify.accuracy.rtol_allowance`), so no matrix with a larger κ
can come back converged whatever the steps, and the stack's scale exceeds λmax
by at most a factor known from n (the Schatten bound,
:func:`matroot.spectrum.lambda_max_bounds.schatten_lambda_max`). Hence

    ``lower = 1 / (κ_max · overestimate(n))``,  ``κ_max = p·rtol / (CHECK_RESOLUTION·u)``.

A matrix whose scaled spectrum reaches below ``lower`` (κ beyond κ_max, or a
scale further above λmax than stated) is not converged by the check of its root,
exactly as an adaptive run that hit its cap; every other matrix gets the steps it
needs (its interval is inside the designed one, where each map is a contraction).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..certify.accuracy import CHECK_RESOLUTION
from ._lower_grid import quantize_lower
from .minimax_coefficients import SMALLEST_LOWER, TAIL, about_identity, rounding_margin, schedule

__all__ = ["FixedPlan", "certifiable_kappa", "fixed_plan", "MAX_FIXED_STEPS"]

#: A plan needing more steps than this in one stage is refused (the adaptive loop runs
#: instead): it would mean a κ_max no method should attempt in fixed steps.
MAX_FIXED_STEPS = 60
#: Points per decade of λ on which the scalar maps are run.
_GRID_PER_DECADE = 24
#: Slack on the next stage's lower bound (as :data:`matroot.solvers.minimax.STAGE_SLACK`).
STAGE_SLACK = 0.9


class FixedPlan(NamedTuple):
    """Steps per square-root stage (one stage for coupled Newton), and, for minimax,
    each stage's step coefficients about the identity (host floats)."""

    steps: tuple[int, ...]
    coefficients: tuple[tuple[tuple[float, float, float], ...], ...] = ()
    lower: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.steps)


def certifiable_kappa(p: int, rtol: float, unit: float) -> float:
    """The largest κ at which a root can be certified at ``rtol``: ``p·rtol/(CHECK_RESOLUTION·u)``.

    Examples
    --------
    >>> from matroot.solvers.fixed_steps import certifiable_kappa
    >>> round(certifiable_kappa(2, 5e-3, 2.0 ** -24))
    167772
    """
    return p * rtol / (CHECK_RESOLUTION * unit)


def _lambda_grid(lower: float) -> np.ndarray:
    decades = max(1.0, -math.log10(lower))
    return np.geomspace(lower, 1.0, int(decades * _GRID_PER_DECADE) + 2)


def _steps_of(step_map, start: np.ndarray, done) -> int:
    """Steps of ``step_map`` until ``done(values)`` holds on every start value."""
    x = start.copy()
    for k in range(MAX_FIXED_STEPS + 1):
        if done(x):
            return k
        x = step_map(x)
    return MAX_FIXED_STEPS + 1


def _newton_schulz_steps(lower: float, tol: float) -> int:
    # At least one step: the map's first step must run before anything can stop.
    return max(1, _steps_of(lambda x: x * ((3.0 - x) / 2.0) ** 2, _lambda_grid(lower),
                            lambda x: bool(np.all(np.abs(1.0 - x) <= tol))))


def _coupled_newton_steps(p: int, lower: float, tol: float) -> int:
    t = (p + 1) / 2
    return max(1, _steps_of(lambda m: m * ((p + 1 - m) / p) ** p, t * _lambda_grid(lower),
                            lambda m: bool(np.all(np.abs(1.0 - m) <= tol))))


def _tail_error(error: float, margin: float) -> float:
    """``max |1 − f(s)|`` of the tail quintic over ``s ∈ [1 − e, (1 + e)(1 + margin)]``."""
    s = np.linspace(1.0 - error, (1.0 + error) * (1.0 + margin), 257)
    a, b, c = TAIL
    x = s * s
    return float(np.max(np.abs(1.0 - s * (a + b * x + c * x * x))))


def _about_identity(row) -> tuple[float, float, float]:
    return tuple(float(v) for v in about_identity(row))  # type: ignore[return-value]


def _minimax_stage(lower: float, tol: float, margin: float):
    sched = schedule(quantize_lower(lower, SMALLEST_LOWER), margin)
    rows = [_about_identity(r) for r in sched.coefficients]
    error = float(sched.errors[-1]) if len(sched.errors) else 0.0
    while error > tol and len(rows) < MAX_FIXED_STEPS + 1:
        rows.append(_about_identity(TAIL))
        error = _tail_error(error, margin)
    if not rows:
        rows.append(_about_identity(TAIL))
    return tuple(rows)


@functools.lru_cache(maxsize=256)
def fixed_plan(method: str, p: int, lower: float, tol: float, unit: float) -> FixedPlan | None:
    """The host plan of a fixed-step solve, or None where ``method`` has no fixed-step
    rule or the plan would exceed :data:`MAX_FIXED_STEPS` in a stage.

    Parameters
    ----------
    method : {"minimax", "newton_db", "coupled_newton"}
        The iteration.
    p : int
        Root order (a power of two for the square-root methods).
    lower : float
        Lower end of the scaled spectrum designed for (:func:`certifiable_kappa` and
        the scale's overestimate).
    tol : float
        Residual per stage at which every λ of ``[lower, 1]`` has converged (the
        call's ``tol``; minimax's stages take ``tol`` times their damping).
    unit : float
        Unit roundoff of the compute dtype (minimax's rounding margin).

    Examples
    --------
    >>> from matroot.solvers.fixed_steps import fixed_plan
    >>> fixed_plan("minimax", 2, 2.8e-6, 6.25e-4, 2.0 ** -24).steps
    (6,)
    >>> fixed_plan("newton_db", 4, 1.4e-6, 6.25e-4, 2.0 ** -24).steps
    (20, 12)
    """
    lower = max(float(lower), SMALLEST_LOWER)
    if method == "coupled_newton":
        steps = _coupled_newton_steps(p, lower, tol)
        return None if steps > MAX_FIXED_STEPS else FixedPlan((steps,), lower=lower)
    if method not in ("minimax", "newton_db"):
        return None
    stages = max(1, round(math.log2(p)))
    counts, rows = [], []
    bound = lower
    for stage in range(stages):
        if method == "minimax":
            damping = 2.0 ** (stages - 1 - stage)
            stage_rows = _minimax_stage(bound, tol * damping, rounding_margin(unit))
            counts.append(len(stage_rows))
            rows.append(stage_rows)
        else:
            counts.append(_newton_schulz_steps(bound, tol))
        bound = STAGE_SLACK * math.sqrt(bound)
    if max(counts) > MAX_FIXED_STEPS:
        return None
    return FixedPlan(tuple(counts), tuple(rows), lower)
