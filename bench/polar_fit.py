"""``python -m bench.polar_fit``: derive :data:`matroot.solvers.polar.fitted.FITTED_QUINTICS`.

Minimises :func:`matroot.solvers.polar.fitted.fit_objective` over the 9 coefficients
of three odd quintics: Nelder-Mead (adaptive) from the first three Polar Express rows
for ``[FITTED_LOWER/FITTED_LOOSENESS, 1]``, then Powell from its result. Both are
deterministic, so the run prints the constants checked into the library (the test
``tests/polar/test_polar_fitted.py`` re-runs it). Starting from the Polar Express rows
for ℓ = 5e-3, 3e-3 or 2e-3 instead ends at the same objective (0.2787) to 4 digits.
Needs SciPy (a test dependency, not the library's). ``--spectra`` prints instead the
real-arithmetic defect of the fitted and of Polar Express's best 3 steps on spectra
other than the fitted ones (docs/polar.rst), under both σmax bounds.
"""

from __future__ import annotations

import sys

import numpy as np

from matroot.solvers.polar.coefficients import band_lower, polar_schedule
from matroot.solvers.polar.fitted import (FITTED_LOOSENESS, FITTED_LOWER, FITTED_MARGIN,
                                          FITTED_QUINTICS, fit_objective, rms_defect, step_tops)

__all__ = ["fit", "main", "spectra", "spectra_table"]
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


def main() -> None:
    if "--spectra" in sys.argv[1:]:
        print(spectra_table())
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
