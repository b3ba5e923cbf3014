"""The torch optimizers' ``step(closure)``: the loss the closure returns, with autograd on.

``torch.optim.Optimizer.step`` runs under ``torch.no_grad()``; a closure re-evaluates the
model and calls ``backward``, so it needs gradients enabled again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["closure_loss"]


def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """The loss ``closure()`` returns, evaluated with autograd enabled; None without one.

    Examples
    --------
    >>> import torch
    >>> w = torch.ones(2, requires_grad=True)
    >>> def closure():
    ...     loss = (w ** 2).sum()
    ...     loss.backward()
    ...     return loss
    >>> with torch.no_grad():
    ...     loss = closure_loss(closure)
    >>> float(loss), w.grad.tolist(), closure_loss(None)
    (2.0, [2.0, 2.0], None)
    """
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
