"""Checks of one step's gradients: their shapes against the block plan, and finiteness.

:func:`nonfinite_flags` reads the host (once when every gradient is finite), for
``nonfinite_grads="raise"``; :func:`all_finite` stays on the device, for a step
that is skipped there (``update(..., finite=...)``, the torch optimizer);
:func:`apply_nonfinite_policy` is the rule for gradients found non-finite on the host,
for every shell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ... import _xp
from . import lists
from .blocking import BlockPlan
from .config import NonFiniteGradientError

__all__ = ["check_gradients", "nonfinite_flags", "nonfinite_params", "all_finite",
           "apply_nonfinite_policy"]


def apply_nonfinite_policy(bad: Sequence[int], policy: str | Callable[[int], str], *,
                           numbering: str = "") -> bool:
    """``nonfinite_grads`` applied to the parameters ``bad`` whose gradients hold NaN/Inf.

    Parameters
    ----------
    bad : sequence of int
        Their numbers (as the caller numbers its parameters).
    policy : "raise", "skip", or callable
        One policy for all, or ``policy(i)`` per parameter number.
    numbering : str
        How ``bad`` numbers them, for the message (e.g. ``" (state_dict numbering)"``).

    Returns
    -------
    bool
        Whether the step is skipped: True when ``bad`` is not empty (parameters, state
        and step counts untouched, ``skipped_steps`` counted).

    Raises
    ------
    NonFiniteGradientError
        Naming ``bad`` where any of them is under ``"raise"``.

    Examples
    --------
    >>> apply_nonfinite_policy([], "raise"), apply_nonfinite_policy([2], "skip")
    (False, True)
    >>> apply_nonfinite_policy([2], "raise")
    Traceback (most recent call last):
    ...
    matroot.optim.shampoo_core.config.NonFiniteGradientError: gradients of parameters [2] \
contain NaN or Inf; pass nonfinite_grads='skip' to skip such steps instead
    """
    bad = list(bad)
    if not bad:
        return False
    policy_of = policy if callable(policy) else (lambda i: policy)
    if any(policy_of(i) == "raise" for i in bad):
        raise NonFiniteGradientError(
            f"gradients of parameters {bad}{numbering} contain NaN or Inf; pass "
            "nonfinite_grads='skip' to skip such steps instead")
    return True


def check_gradients(grads, plan: BlockPlan) -> list:
    """``grads`` as a list, one per planned parameter (None or of its shape).

    Raises
    ------
    ValueError
        Naming the parameter whose gradient does not fit, or the counts.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim.shampoo_core.blocking import plan_blocks
    >>> check_gradients([np.zeros((2, 3))], plan_blocks([(3, 2)], ["float32"]))
    Traceback (most recent call last):
    ...
    ValueError: gradient 0 has shape (2, 3), parameter has (3, 2)
    """
    grads = list(grads)
    count = len(plan.params)
    if len(grads) != count:
        raise ValueError(f"got {len(grads)} gradients for {count} parameters")
    for i, (g, layout) in enumerate(zip(grads, plan.params)):
        if g is not None and tuple(g.shape) != layout.shape:
            raise ValueError(f"gradient {i} has shape {tuple(g.shape)}, parameter has "
                             f"{layout.shape}")
    return grads


def nonfinite_flags(grads) -> list:
    """Per gradient, whether it holds NaN/Inf (False for None); one host sync if all are finite.

    Examples
    --------
    >>> import numpy as np
    >>> nonfinite_flags([np.ones(2), None, np.array([1.0, np.nan])])
    [False, False, True]
    """
    present = [g for g in grads if g is not None]
    if not present:
        return [False] * len(grads)
    xp = _xp.array_namespace(*present)
    # A finite sum has finite terms (NaN and Inf reach any sum they are in), and a sum
    # is one read of the gradient where isfinite writes a mask. Summed in float64, no
    # float32 or 16-bit gradient overflows it; one that did would only go on to the
    # exact check below.
    wide = {"dtype": xp.float64} if _xp.has_float64(xp) else {}
    if bool(xp.all(xp.isfinite(xp.stack([xp.sum(g, **wide) for g in present])))):
        return [False] * len(grads)
    return [g is not None and not bool(xp.all(xp.isfinite(g))) for g in grads]


def nonfinite_params(xp, grads) -> list[int]:
    """The positions of the gradients holding NaN/Inf (None entries are skipped): one
    host read when all are finite (on PyTorch from one foreach reduction, whatever
    their number), the per-gradient flags only when something is found.

    Examples
    --------
    >>> import numpy as np
    >>> nonfinite_params(np, [np.ones(2), None, np.array([1.0, np.nan])])
    [2]
    """
    present = [g for g in grads if g is not None]
    # Meta and fake tensors (a traced step) have no values to screen.
    if not present or any(_xp.holds_no_values(g) for g in present) or \
            bool(lists.finite_flag(xp, present)):
        return []
    return [i for i, flag in enumerate(nonfinite_flags(grads)) if flag]


def all_finite(grads):
    """Whether every gradient is finite, as a 0-d boolean array on their device (no
    host read; None entries are skipped), for :func:`update`'s ``finite``.

    Examples
    --------
    >>> import numpy as np
    >>> bool(all_finite([np.ones(2), None, np.array([1.0, np.inf])]))
    False
    """
    present = [g for g in grads if g is not None]
    if not present:
        raise ValueError("grads is empty")
    xp = _xp.array_namespace(*present)
    return xp.all(xp.stack([xp.all(xp.isfinite(g)) for g in present]))
