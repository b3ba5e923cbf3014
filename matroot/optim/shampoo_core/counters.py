"""The step counts a Shampoo step advances: the family's ``step`` and ``skipped_steps``,
and each parameter's step (its bias corrections).

A count is a Python int or a 0-d integer (or float64, the torch shell's ``step``)
array. Arrays are advanced in place when the step overwrites its state (``in_place``
on a mutable library), so a captured step (a CUDA graph) advances the same memory at
every replay; parameters that share one count (the same 0-d array, as the torch shell
passes it while they have had gradients at the same steps) advance it once, and the
counts advance in one list operation (:mod:`matroot.optim.shampoo_core.lists`).
"""

from __future__ import annotations

import numbers

from . import lists

__all__ = ["advance", "advance_param_steps"]


def _as_count(xp, flag, dtype):
    """A 0-d boolean ``flag`` as an increment of a count of ``dtype``: as it is on torch,
    which adds a boolean to a number as 0 or 1 (a cast would be an operation of its
    own), cast elsewhere (the array API adds no booleans to numbers)."""
    return flag if lists.is_foreach(xp) else xp.astype(flag, dtype)


def advance(xp, count, by=None, *, in_place: bool = False):
    """``count + 1``, or ``count + by`` for a 0-d boolean array ``by`` (a device-side
    count that stands still where ``by`` is False); into ``count`` itself when it is
    an array and ``in_place``."""
    if by is None:
        step = 1
    else:
        step = _as_count(xp, by, count.dtype if hasattr(count, "dtype") else xp.int64)
    if in_place and not isinstance(count, numbers.Integral):
        count += step
        return count
    return count + step


def advance_param_steps(xp, steps, present, taken, *, in_place: bool = False) -> tuple:
    """Each parameter's step for this step's bias corrections (its count plus one,
    taken or not) and its stored count after the step (plus one where it has a
    gradient and the step is taken), as lists. Entries that are one 0-d array stay
    one."""
    steps = list(steps)
    arrays: dict = {}
    for s, p in zip(steps, present):
        if p and not isinstance(s, numbers.Integral):
            arrays.setdefault(id(s), s)
    ids, values = list(arrays), list(arrays.values())
    if in_place and taken is None:
        following = kept = dict(zip(ids, lists.add_(xp, values, 1)))
    else:
        following = dict(zip(ids, lists.add(xp, values, 1)))
        kept = following
        if taken is not None and values:
            by = _as_count(xp, taken, values[0].dtype)
            kept = dict(zip(ids, lists.add_(xp, values, by) if in_place
                            else lists.add(xp, values, by)))
    this, stored = [], []
    for s, p in zip(steps, present):
        if isinstance(s, numbers.Integral):
            this.append(s + 1)
            stored.append(advance(xp, s, taken) if p else s)
        else:
            this.append(following.get(id(s), s))
            stored.append(kept[id(s)] if p else s)
    return this, tuple(stored)
