"""One elementwise operation over a list of arrays, as one dispatch where the backend
has it: torch's ``_foreach_*`` kernels (one launch per list on CUDA, one dispatched
operation on any device) when eager, a loop elsewhere and under ``torch.compile``
(which fuses it). Pure: new arrays, inputs untouched.

An optimizer step that updates many parameters one by one costs a launch per
operation per parameter; with these it costs one per operation.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from .namespace import array_namespace, is_torch_namespace

__all__ = ["each"]

_PLAIN: dict[str, Callable[..., Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
    "lerp": lambda start, end, weight: start + weight * (end - start),
}


def _torch_lists(first: Sequence[Any], rest: Sequence[Any]) -> bool:
    """Whether torch's foreach kernels take these arguments: torch tensors, one device,
    and scalar weights that are Python numbers (a traced or tensor scalar is not)."""
    if not first or not is_torch_namespace(array_namespace(first[0])):
        return False
    import torch
    if torch.compiler.is_compiling():
        # A foreach kernel's scalar list is a guard torch.compile recompiles on (a
        # scheduler's μ, the bias corrections); traced, the loop fuses anyway.
        return False
    device = first[0].device
    for arg in rest:
        items = arg if isinstance(arg, (list, tuple)) else [arg]
        for item in items:
            if hasattr(item, "device"):
                if item.device != device:
                    return False
            elif not isinstance(item, (int, float)):
                return False
    return all(t.device == device for t in first)


def each(op: str, first: Sequence[Any], *rest: Any) -> list:
    """``[op(first[i], rest_0[i] or rest_0, ...)]`` for ``op`` in add, sub, mul, div,
    lerp (``start + weight·(end − start)``) or sqrt.

    Each of ``rest`` is a list as long as ``first`` (arrays or Python numbers) or one
    scalar for all.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot._xp.foreach import each
    >>> out = each("lerp", [np.zeros(2), np.ones(1)], [np.ones(2), np.zeros(1)], 0.25)
    >>> [a.tolist() for a in out]
    [[0.25, 0.25], [0.75]]
    """
    first = list(first)
    if not first:
        return []
    args = [list(a) if isinstance(a, (list, tuple)) else a for a in rest]
    if _torch_lists(first, args):
        import torch
        return list(getattr(torch, f"_foreach_{op}")(first, *args))
    if op == "sqrt":
        return [array_namespace(a).sqrt(a) for a in first]
    plain: Callable[..., Any] = _PLAIN[op]
    return [plain(a, *(arg[i] if isinstance(arg, list) else arg for arg in args))
            for i, a in enumerate(first)]
