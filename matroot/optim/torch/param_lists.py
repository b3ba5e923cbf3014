"""A parameter group's ``params`` with each tensor once: a tied weight (an embedding
shared with the LM head) is listed twice by ``model.named_parameters(remove_duplicate=False)``
or by a list built module by module. torch's optimizers warn and update it once per
listing (two steps per step, and one ``state`` entry advanced twice); matroot's update
it once, with its one (summed) gradient, as ``model.parameters()`` would list it."""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["listed_once"]


def listed_once(params: Any, optimizer: str) -> Any:
    """``params`` (tensors or ``(name, tensor)`` pairs) as a list without repeats of a
    tensor, the first listing kept, with a ``UserWarning`` where any was dropped; one
    tensor or a set as it is (torch's loader takes the one, refuses the set).

    Examples
    --------
    >>> import torch, warnings
    >>> w, b = torch.zeros(2, 2), torch.zeros(2)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     kept = listed_once([("emb.weight", w), ("b", b), ("head.weight", w)], "Muon")
    >>> [name for name, _ in kept], len(caught)
    (['emb.weight', 'b'], 1)
    """
    if isinstance(params, (torch.Tensor, set)):
        return params
    listed = list(params)
    seen: set[int] = set()
    kept = []
    for p in listed:
        tensor = p[1] if isinstance(p, tuple) and len(p) == 2 else p
        if id(tensor) not in seen:
            seen.add(id(tensor))
            kept.append(p)
    if len(kept) < len(listed):
        warnings.warn(
            f"{len(listed) - len(kept)} parameter(s) listed more than once in one parameter "
            f"group (tied weights, as named_parameters(remove_duplicate=False) lists them): "
            f"{optimizer} keeps the first listing and updates each once, with its summed "
            "gradient", UserWarning, stacklevel=4)
    return kept
