"""What ``converged=True`` means, decided in one place.

A root is converged when its method stopped (on ``tol``, at its rounding floor,
or after the fixed ``tol=0`` step count), it is usable (finite and positive
definite in the output dtype) and its a-posteriori error estimate
(:mod:`matroot.verify`) meets the accuracy asked for: the README table's target
for its κ, or a looser ``tol``.
"""

from __future__ import annotations

from ._typing import Array

__all__ = ["is_converged", "unit_roundoff"]


def unit_roundoff(xp, dtype) -> float:
    """``u = eps/2`` of a floating ``dtype`` of the array namespace ``xp``.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.accuracy import unit_roundoff
    >>> unit_roundoff(np, np.float32) == 2.0 ** -24
    True
    """
    return float(xp.finfo(dtype).eps) / 2


def is_converged(stopped: Array, usable: Array, error_estimate: Array,
                 accuracy: Array) -> Array:
    """Per matrix: the method stopped, the root is usable and its estimated error is
    within ``accuracy``. Every verdict ``converged`` in matroot is this one.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.accuracy import is_converged
    >>> yes = np.array([True, True, True])
    >>> is_converged(yes, np.array([True, True, False]), np.array([1e-4, 1e-2, 0.0]),
    ...              np.array([1e-3, 1e-3, 1e-3])).tolist()
    [True, False, False]
    """
    return stopped & usable & (error_estimate <= accuracy)
