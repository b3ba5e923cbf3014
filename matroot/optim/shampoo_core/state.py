"""The Shampoo optimizer's state: one NamedTuple of arrays, counters and the block plan.

:func:`matroot.optim.init` makes it, :func:`matroot.optim.update` returns the next
one; :func:`copy_state` and :func:`state_bytes` work on any of them.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ... import _xp
from .blocking import BlockPlan

__all__ = ["ShampooState", "copy_state", "state_bytes"]


class ShampooState(NamedTuple):
    """Optimizer state: arrays plus integer counters and the static block plan.

    Attributes
    ----------
    step : int or 0-d integer array
        Steps taken (skipped steps not counted); drives the root schedule unless
        :func:`update` is given one.
    param_steps : tuple of int or of 0-d arrays
        Steps in which each parameter had a gradient; drives bias correction.
    exp_avg, exp_avg_sq : list of arrays or None
        First and second moments, parameter-shaped, in the compute dtype
        (float32 for 16-bit parameters); None before a parameter's first
        gradient in a lazy state, and ``exp_avg_sq`` always for SGD grafting.
    factors, roots : list of arrays or None
        One ``(count, n, n)`` stack per ``plan.stacks`` entry (None until first
        needed in a lazy state); factors ``(count, n(n+1)/2)`` with ``symmetric_packing``,
        roots in ``root_storage_dtype``.
    root_failures : list of int32 arrays or None
        Per factor, the refreshes whose root was rejected.
    root_refreshes : int or 0-d integer array
        Refresh rounds run.
    skipped_steps : int or 0-d integer array
        Steps skipped for non-finite gradients.
    plan : BlockPlan
    momentum_buffer : list of arrays or None
        Per parameter, the momentum of the final update (None without momentum).
    factor_bounds : list of arrays or None
        Per stack, each factor's carried λmax bound and its floor, shape
        ``(count, 2)`` (:mod:`matroot.optim.shampoo_core.factor_bounds`); None (or a None
        entry beside factors) where they are unknown: the next refresh finds them.
    """

    step: Any
    param_steps: tuple
    exp_avg: list
    exp_avg_sq: list
    factors: list
    roots: list
    root_failures: list
    root_refreshes: Any
    skipped_steps: Any
    plan: BlockPlan
    momentum_buffer: list | None = None
    factor_bounds: list | None = None



def copy_state(state: ShampooState) -> ShampooState:
    """A copy of ``state`` whose arrays share no memory with it."""
    def copies(arrays):
        if arrays is None:
            return None
        return [None if a is None else _xp.array_namespace(a).asarray(a, copy=True)
                for a in arrays]

    return state._replace(exp_avg=copies(state.exp_avg), exp_avg_sq=copies(state.exp_avg_sq),
                          factors=copies(state.factors), roots=copies(state.roots),
                          root_failures=copies(state.root_failures),
                          momentum_buffer=copies(state.momentum_buffer),
                          factor_bounds=copies(state.factor_bounds))


def _nbytes(arrays) -> int:
    total = 0
    for a in arrays or ():
        if a is None:
            continue
        xp = _xp.array_namespace(a)
        info = xp.finfo if xp.isdtype(a.dtype, "real floating") else xp.iinfo
        total += math.prod(a.shape) * info(a.dtype).bits // 8
    return total


def state_bytes(state: ShampooState) -> dict:
    """Bytes held by the state, by kind, and per optimized parameter element.

    Returns
    -------
    dict
        ``moments`` (both moments and the momentum buffer), ``factors``, ``roots``,
        ``counters`` (failure counts and carried λmax bounds), ``total`` (bytes) and
        ``per_parameter`` (total bytes / number of parameter elements).
    """
    moments = _nbytes(state.exp_avg) + _nbytes(state.exp_avg_sq) + \
        _nbytes(state.momentum_buffer)
    factors = _nbytes(state.factors)
    roots = _nbytes(state.roots)
    counters = _nbytes(state.root_failures) + _nbytes(state.factor_bounds)
    total = moments + factors + roots + counters
    elements = sum(math.prod(p.shape) for p in state.plan.params)
    return {"moments": moments, "factors": factors, "roots": roots, "counters": counters,
            "total": total, "per_parameter": total / elements if elements else 0.0}
