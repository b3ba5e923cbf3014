"""Lower bounds quantized onto a logarithmic grid, on the host or on the device.

minimax and chebyshev build their coefficients for a lower bound of the scaled
spectrum rounded *down* onto a grid (a smaller bound is still a valid one), so
nearby bounds share a cached schedule. Under ``jax.jit`` the bound is a traced
array: there the tables are built for every grid point and indexed on the device.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _xp

#: Largest lower bound the grids hold (above it the interval is trivially narrow).
LARGEST_LOWER = 0.5


def quantize_lower(lower: float, smallest: float, steps_per_decade: int) -> float:
    """Round ``lower`` down onto the grid ``10^(j/steps_per_decade)``, clipped to
    ``[smallest, LARGEST_LOWER]`` first."""
    lower = min(max(float(lower), smallest), LARGEST_LOWER)
    return 10.0 ** (math.floor(math.log10(lower) * steps_per_decade) / steps_per_decade)


@_xp.host_constant
def lower_grid(smallest: float, steps_per_decade: int) -> np.ndarray:
    """Every value :func:`quantize_lower` can return, ascending (read-only)."""
    first = math.floor(math.log10(smallest) * steps_per_decade)
    last = math.floor(math.log10(LARGEST_LOWER) * steps_per_decade)
    grid = np.array([10.0 ** (j / steps_per_decade) for j in range(first, last + 1)])
    grid.flags.writeable = False
    return grid


def device_grid_index(lower, grid: np.ndarray):
    """Per matrix, the index of the largest grid value ``<= lower`` (0 below the
    grid), computed on the device: no host read, so it works under ``jax.jit``."""
    xp = _xp.array_namespace(lower)
    values = _xp.from_numpy(xp, grid, dtype=lower.dtype, device=_xp.device_of(lower))
    below = xp.astype(values[None, :] <= lower[:, None], xp.int32)
    return xp.maximum(xp.sum(below, axis=1) - 1, xp.zeros_like(below[:, 0]))
