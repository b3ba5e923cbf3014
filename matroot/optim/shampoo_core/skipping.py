"""The coefficients of a step that may be skipped on the device, all from one select.

A step whose gradients may be non-finite runs with a 0-d boolean ``step_taken``
(:func:`matroot.optim.update`'s ``finite``) and no host read: where it is False every
array keeps its value. Rather than a select per array, the coefficients the step
multiplies by anyway carry the choice: ``1 − β₁`` is ``(1 − β₁)`` or 0, the moments'
and factors' decays ``β`` or 1, the bounds' widening its value or 1, and the gradients
are zero (:func:`matroot.optim.shampoo_core.lists.zero_unless`), so the products leave
the old values exactly. All of a step's coefficients of one dtype are one vector, one
``where`` between two constant vectors made once per values, dtype and device: on a
GPU, one launch per dtype per step for the whole skip rule.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ... import _xp
from ...certify.accuracy import unit_roundoff

__all__ = ["Coefficients", "SkipCoefficients", "skip_coefficients"]


class Coefficients(NamedTuple):
    """One dtype's coefficients for this step (0-d arrays; views of one vector)."""

    #: 1 where the step is taken, else 0.
    taken: Any
    #: ``1 − β₁`` or 0: the first moment's rate.
    rate1: Any
    #: ``β₂'`` or 1: the grafting second moment's decay (1 where it has none).
    decay2: Any
    #: ``1 − β₂'`` (1 for a running sum) or 0: its rate.
    rate2: Any
    #: ``μ`` or 1: the momentum buffer's decay.
    momentum: Any
    #: ``β₂`` or 1: the factors' (and their bounds') decay.
    factor_decay: Any
    #: ``1 + 4u`` or 1: the carried bounds' widening (``u`` the dtype's unit roundoff).
    widen: Any


#: The coefficients of a skipped step, in :class:`Coefficients` order.
_SKIPPED = (0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0)
#: Constant vectors by (backend, device, dtype, values); oldest dropped first.
_VECTORS: dict = {}
_VECTORS_KEPT = 64


def _vector(xp, values: tuple, dtype, device):
    return _xp.kept(_VECTORS, (_xp.backend_name(xp), str(device), str(dtype), values),
                    _VECTORS_KEPT, lambda: xp.asarray(values, dtype=dtype, device=device))


class SkipCoefficients:
    """A step's :class:`Coefficients` per dtype, made from the 0-d boolean ``step_taken``
    with one ``where`` each.

    Parameters
    ----------
    step_taken : 0-d boolean array
    beta1 : float
        The first moment's ``β₁``.
    second_moment_beta : float or None
        ``β₂'`` of the grafting second moment (None: none kept).
    momentum : float
    factor_beta : float
        The factors' ``β₂``.

    Examples
    --------
    >>> import numpy as np
    >>> skip = SkipCoefficients(np.asarray(False), beta1=0.9, second_moment_beta=0.999,
    ...                         momentum=0.0, factor_beta=0.999)
    >>> [float(c) for c in skip.of(np, np.float32)]
    [0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    """

    def __init__(self, step_taken, *, beta1: float = 0.9, second_moment_beta=None,
                 momentum: float = 0.0, factor_beta: float = 1.0):
        self.step_taken = step_taken
        beta2 = 1.0 if second_moment_beta is None else float(second_moment_beta)
        self._taken = (1.0, 1.0 - beta1, beta2, 1.0 if beta2 == 1.0 else 1.0 - beta2,
                       float(momentum), float(factor_beta))
        self._made: dict = {}

    def of(self, xp, dtype) -> Coefficients:
        """This step's coefficients as 0-d arrays of ``dtype``."""
        key = str(dtype)
        if key not in self._made:
            device = _xp.device_of(self.step_taken)
            taken = self._taken + (1.0 + 4 * unit_roundoff(xp, dtype),)
            both = xp.where(self.step_taken, _vector(xp, taken, dtype, device),
                            _vector(xp, _SKIPPED, dtype, device))
            self._made[key] = Coefficients(*(both[i] for i in range(len(_SKIPPED))))
        return self._made[key]


def skip_coefficients(step_taken, config) -> SkipCoefficients | None:
    """``step_taken`` as :class:`SkipCoefficients` for a Shampoo-style ``config`` (its
    ``betas``, ``second_moment_beta`` and ``momentum``); as it is when it is None or
    already one."""
    if step_taken is None or isinstance(step_taken, SkipCoefficients):
        return step_taken
    return SkipCoefficients(step_taken, beta1=config.betas[0],
                            second_moment_beta=config.second_moment_beta,
                            momentum=config.momentum, factor_beta=config.betas[1])
