"""Lower bounds on the scaled spectrum, rounded down onto a logarithmic grid.

The polynomial methods build a fit (chebyshev) or a step schedule (minimax) per
lower bound and cache it; rounding the bound down to :data:`STEPS_PER_DECADE`
steps per decade lets nearby bounds share one cached entry, and a smaller bound
is still a valid one.
"""

from __future__ import annotations

import math

#: Grid steps per decade of the lower bound.
STEPS_PER_DECADE = 8
#: Largest grid value: a bound above it is rounded down to it.
LARGEST_LOWER = 0.5


def quantize_lower(lower: float, smallest: float) -> float:
    """Round ``lower`` down onto the grid, clipped to ``[smallest, LARGEST_LOWER]``.

    Examples
    --------
    >>> from matroot.solvers._lower_grid import quantize_lower
    >>> round(quantize_lower(0.011, 1e-12), 6), quantize_lower(0.0, 1e-12)
    (0.01, 1e-12)
    """
    lower = min(max(float(lower), smallest), LARGEST_LOWER)
    return 10.0 ** (math.floor(math.log10(lower) * STEPS_PER_DECADE) / STEPS_PER_DECADE)
