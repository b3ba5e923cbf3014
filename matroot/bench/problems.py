"""The benchmark's stacks moved to :mod:`matroot.testing` (one set of fixtures):
:func:`matroot.testing.scaled_spd_stack` and :func:`matroot.testing.shampoo_factors`.

Kept for the experiment scripts in the repository's ``bench/`` that import
``spd_stack`` from here.
"""

from __future__ import annotations

import warnings

import numpy as np

from matroot.testing import scaled_spd_stack

__all__ = ["spd_stack"]


def spd_stack(n: int, batch: int, kappa: float, *, seed: int = 0,
              dtype=np.float32) -> np.ndarray:
    """Deprecated: ``matroot.testing.scaled_spd_stack(batch, n, kappa, ...)``, the same stack.

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from matroot.bench.problems import spd_stack
    >>> from matroot.testing import scaled_spd_stack
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)
    ...     old = spd_stack(8, 2, 10.0, seed=3)
    >>> bool(np.array_equal(old, scaled_spd_stack(2, 8, 10.0, seed=3)))
    True
    """
    warnings.warn("matroot.bench.problems.spd_stack(n, batch, kappa) is now "
                  "matroot.testing.scaled_spd_stack(batch, n, kappa)", DeprecationWarning,
                  stacklevel=2)
    return scaled_spd_stack(batch, n, kappa, seed=seed, dtype=dtype)
