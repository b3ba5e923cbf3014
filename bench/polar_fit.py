"""``python -m bench.polar_fit``: derive :data:`matroot.solvers.polar.fitted.FITTED_QUINTICS`.

Minimises :func:`matroot.solvers.polar.fitted.fit_objective` over the 9 coefficients
of three odd quintics: Nelder-Mead (adaptive) from the first three Polar Express rows
for ``[FITTED_LOWER/FITTED_LOOSENESS, 1]``, then Powell from its result. Both are
deterministic, so the run prints the constants checked into the library (the test
``tests/polar/test_polar_fitted.py`` re-runs it). Starting from the Polar Express rows
for ℓ = 5e-3, 3e-3 or 2e-3 instead ends at the same objective (0.2787) to 4 digits.
Needs SciPy (a test dependency, not the library's).
"""

from __future__ import annotations

import numpy as np

from matroot.solvers.polar.coefficients import polar_schedule
from matroot.solvers.polar.fitted import (FITTED_LOOSENESS, FITTED_LOWER, FITTED_MARGIN,
                                          fit_objective, step_tops)

__all__ = ["fit", "main"]


def fit() -> tuple[tuple[float, float, float], ...]:
    """The fitted ``(c1, c3, c5)`` rows (about 10 s)."""
    from scipy.optimize import minimize

    start = polar_schedule(FITTED_LOWER / FITTED_LOOSENESS, 1e-9, FITTED_MARGIN).coefficients[:3]
    result = minimize(fit_objective, np.ravel(start), method="Nelder-Mead",
                      options=dict(maxiter=20000, maxfev=20000, xatol=1e-9, fatol=1e-12,
                                   adaptive=True))
    result = minimize(fit_objective, result.x, method="Powell",
                      options=dict(maxiter=20000, xtol=1e-9, ftol=1e-12))
    return tuple(tuple(float(c) for c in row) for row in result.x.reshape(3, 3))


def main() -> None:
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
