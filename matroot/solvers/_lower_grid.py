"""Lower bounds on the scaled spectrum, rounded down onto a logarithmic grid.

The polynomial methods build a fit (chebyshev) or a step schedule (minimax) per
lower bound and cache it; rounding the bound down to :data:`STEPS_PER_DECADE`
steps per decade lets nearby bounds share one cached entry, and a smaller bound
is still a valid one. When the bound is traced (``jax.jit``, ``torch.compile``)
the tables are built for every grid value and indexed on the device.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _xp

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


@_xp.host_constant
def lower_grid(smallest: float) -> np.ndarray:
    """Every value :func:`quantize_lower` can return for ``smallest``, ascending.

    Under ``jax.jit`` or ``torch.compile`` the bound is traced: the tables are
    built for every grid value and indexed on the device
    (:func:`device_grid_index`).
    """
    first = math.floor(math.log10(smallest) * STEPS_PER_DECADE)
    last = math.floor(math.log10(LARGEST_LOWER) * STEPS_PER_DECADE)
    grid = np.array([10.0 ** (j / STEPS_PER_DECADE) for j in range(first, last + 1)])
    grid.flags.writeable = False
    return grid


def device_grid_index(lower, grid: np.ndarray):
    """Per matrix, the index of the largest grid value ``<= lower`` (0 below the
    grid), computed on the device: no host read, so it works when traced."""
    xp = _xp.array_namespace(lower)
    values = _xp.from_numpy(xp, grid, dtype=lower.dtype, device=_xp.device_of(lower))
    below = xp.astype(values[None, :] <= lower[:, None], xp.int32)
    return xp.maximum(xp.sum(below, axis=1) - 1, xp.zeros_like(below[:, 0]))
