"""``python -m bench polar_fit``: derive :data:`matroot.solvers.polar.fitted.FITTED_QUINTICS`.

Minimises :func:`matroot.solvers.polar.fitted.fit_objective` over the 9 coefficients
of three odd quintics: Nelder-Mead (adaptive) from the first three Polar Express rows
for ``[FITTED_LOWER/FITTED_LOOSENESS, 1]``, then Powell from its result. Both are
deterministic, so the run prints the constants checked into the library (the test
``tests/polar/test_polar_fitted.py`` re-runs it). Starting from the Polar Express rows
for ℓ = 5e-3 or 3e-3 instead ends at the same objective (0.278694), from 2e-3 at 0.2793.
Needs SciPy (a test dependency, not the library's). ``--spectra`` prints instead the
real-arithmetic defect of the fitted and of Polar Express's best 3 steps on spectra
other than the fitted ones (docs/polar.rst), under both σmax bounds; ``--bounds`` the
numbers behind docs/polar.rst's argument on κ = 1e4 in 12 products (add ``--lp`` for the
linear program, about 20 minutes).
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from matroot.solvers.polar.coefficients import band_lower, polar_schedule
from matroot.solvers.polar.fitted import (FITTED_CAP, FITTED_LOOSENESS, FITTED_LOWER,
                                          FITTED_MARGIN, FITTED_QUINTICS, fit_objective,
                                          rms_defect, step_tops)

__all__ = ["bernstein_rms", "bounds_report", "fit", "greedy_error", "main",
           "positive_envelope", "spectra", "spectra_table"]
#: Cholesky's σmax bound is at most this far above σmax (its 5 % safety on σmax²).
CHOLESKY_LOOSENESS = 1.025


def fit() -> tuple[tuple[float, float, float], ...]:
    """The fitted ``(c1, c3, c5)`` rows (about 10 s)."""
    from scipy.optimize import minimize

    start = polar_schedule(FITTED_LOWER / FITTED_LOOSENESS, 1e-9, FITTED_MARGIN).coefficients[:3]
    result = minimize(fit_objective, np.ravel(start), method="Nelder-Mead",
                      options=dict(maxiter=20000, maxfev=20000, xatol=1e-9, fatol=1e-12,
                                   adaptive=True))
    result = minimize(fit_objective, result.x, method="Powell",
                      options=dict(maxiter=20000, xtol=1e-9, ftol=1e-12))
    return tuple((float(c1), float(c3), float(c5)) for c1, c3, c5 in result.x.reshape(3, 3))


def spectra(n: int = 64) -> dict[str, np.ndarray]:
    """Spectra with σmin/σmax ≥ 1e-2 (σmax = 1), n values each."""
    half, quarter = n // 2, n // 4
    return {
        "log-spaced [1e-2, 1]": np.logspace(0, -2, n),
        "uniform [1e-2, 1]": np.linspace(1, 1e-2, n),
        "half at 1, half log-spaced": np.r_[np.ones(half), np.logspace(0, -2, n - half)],
        "clustered in [0.9, 1], one at 1e-2": np.r_[np.linspace(1, 0.9, n - 1), 1e-2],
        "one at 1, the rest log-spaced [1e-2, 0.1]": np.r_[1.0, np.logspace(-1, -2, n - 1)],
        "two-valued 1 and 0.1": np.r_[np.ones(half), np.full(n - half, 0.1)],
        "two-valued 1 and 3e-2": np.r_[np.ones(half), np.full(n - half, 3e-2)],
        "two-valued 1 and 1e-2": np.r_[np.ones(half), np.full(n - half, 1e-2)],
        "a quarter at 1e-2, the rest log-spaced":
            np.r_[np.logspace(0, -2, n - quarter), np.full(quarter, 1e-2)],
        "one at 1, the rest at 1e-2": np.r_[1.0, np.full(n - 1, 1e-2)],
    }


def spectra_table(n: int = 64) -> str:
    """Markdown: the real-arithmetic defect on each of :func:`spectra`, scaled by the
    Cholesky bound at its loosest and by the Gram-norm bound (exact for the spectrum)."""
    plain = polar_schedule(band_lower(3), 1e-9, FITTED_MARGIN).coefficients[:3]
    lines = [f"| spectrum (n = {n}) | Gram-norm ρ | rms_quintic, Cholesky | rms_quintic, "
             "Gram-norm | Polar Express 3 steps, Cholesky | Polar Express 3 steps, Gram-norm |",
             "|---|---|---|---|---|---|"]
    for name, sigma in spectra(n).items():
        rho = float(np.sum(sigma ** 8) ** 0.125)
        cells = [rms_defect(rows, sigma / scale) for rows in (FITTED_QUINTICS, plain)
                 for scale in (CHOLESKY_LOOSENESS, rho)]
        lines.append(f"| {name} | {rho:.2f} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def bernstein_rms(degree: int, top: float, kappa: float, n: int = 64,
                  envelope=None) -> float:
    """A lower bound on the defect of any odd polynomial of ``degree`` with ``|p| ≤ top``
    on ``[0, 1]``, on n log-spaced σ over ``[1/κ, 1]``: Bernstein's inequality for the
    trigonometric polynomial ``p(sin θ)`` gives ``|p(σ)| ≤ top·degree·arcsin σ``
    (``envelope(σ)``, a sharper bound, replaces it)."""
    sigma = np.logspace(-np.log10(kappa), 0.0, n)  # ascending, as _capped needs
    reach = (top * degree * np.arcsin(sigma) if envelope is None
             else np.array([envelope(s) for s in sigma]))
    p = np.minimum(reach, 1.0)
    return float(np.sqrt(np.mean((1.0 - p * p) ** 2)))


def greedy_error(lower: float, steps: int) -> float:
    """``max |p(σ) − 1|`` on ``[lower, 1]`` after ``steps`` greedy minimax quintics (no
    cushion, no margin): the least any composition of that many odd quintics leaves."""
    from matroot.solvers.minimax_coefficients import quintic_sign_minimax

    lo, hi, error = lower, 1.0, 1.0 - lower
    for _ in range(steps):
        _, error = quintic_sign_minimax(lo / hi)
        lo, hi = 1.0 - error, 1.0 + error
    return float(error)


def positive_envelope(degree: int, top: float, sigma: float, points: int = 4000) -> float:
    """The largest ``p(σ)`` over odd polynomials of ``degree`` with ``0 ≤ p ≤ top`` on a
    grid of ``[0, 1]`` (a linear program in the Chebyshev basis). Fewer constraints than
    the whole interval, so it bounds the true largest value from above."""
    from scipy.optimize import linprog

    ks = np.arange(1, degree + 1, 2)
    x = np.unique(np.r_[np.cos(np.linspace(0.0, np.pi / 2, points)),
                        np.linspace(0.0, min(3 * sigma, 1.0), 400)])
    basis = np.cos(np.outer(np.arccos(x), ks))
    result = linprog(-np.cos(ks * np.arccos(sigma)), A_ub=np.r_[basis, -basis],
                     b_ub=np.r_[np.full(len(x), top), np.zeros(len(x))],
                     bounds=[(None, None)] * len(ks), method="highs")
    return float(-result.fun)


def bounds_report(lp: bool = False) -> str:
    """The numbers of docs/polar.rst's κ = 1e4 argument."""
    from scipy.optimize import brentq

    lines = [f"greedy minimax max |p - 1|: 3 quintics on [1e-2, 1] {greedy_error(1e-2, 3):.3f}, "
             f"4 on [1e-4, 1] {greedy_error(1e-4, 4):.3f}"]
    for degree, form in ((625, "4 quintics"), (729, "6 cubics"), (4096, "any 12 products")):
        bound = bernstein_rms(degree, FITTED_CAP, 1e4)
        needed = (brentq(lambda top, d=degree: bernstein_rms(d, top, 1e4) - 0.3, 1.0, 50.0)
                  if bound > 0.3 else float("nan"))
        lines.append(f"{form} (degree {degree}): defect >= {bound:.3f} at M = {FITTED_CAP}; "
                     f"0.3 needs M >= {needed:.2f}")
    if lp:
        envelope = functools.partial(positive_envelope, 625, FITTED_CAP)
        lines.append(f"positive, degree 625: p(1e-4) <= {envelope(1e-4):.4f} (Bernstein "
                     f"{FITTED_CAP * 625 * np.arcsin(1e-4):.4f}); defect >= "
                     f"{bernstein_rms(625, FITTED_CAP, 1e4, envelope=_capped(envelope)):.3f}")
    return "\n".join(lines)


def _capped(envelope):
    """``envelope`` that stops solving once it reaches 1 (larger σ reach 1 too)."""
    reached: list[float] = []

    def capped(sigma: float) -> float:
        if reached and sigma >= reached[0]:
            return 1.0
        value = envelope(sigma)
        if value >= 1.0:
            reached.append(sigma)
        return value
    return capped


def main() -> None:
    if "--spectra" in sys.argv[1:]:
        print(spectra_table())
        return
    if "--bounds" in sys.argv[1:]:
        print(bounds_report(lp="--lp" in sys.argv[1:]))
        return
    rows = fit()
    q_min, tops = step_tops(rows)
    print(f"objective {fit_objective(np.ravel(rows)):.6f}, smallest q {q_min:.4f}, "
          f"tops {', '.join(f'{t:.4f}' for t in tops)}")
    print("FITTED_QUINTICS = (")
    for row in rows:
        print(f"    ({row[0]!r}, {row[1]!r}, {row[2]!r}),")
    print(")")


if __name__ == "__main__":
    main()
