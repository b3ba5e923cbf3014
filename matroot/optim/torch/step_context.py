"""What a torch shell's ``step`` runs inside, whatever context the training script
called it from.

* Autocast off. Scripts often call ``optimizer.step()`` inside the
  ``torch.autocast`` block of the forward pass; the factor products, root solves
  and polar iterations would then run in bfloat16/float16, changing the update
  (torch's own optimizers do no matrix products, so autocast never reached them).
* Host reads off on parameters that hold shapes but no values: on torch's ``meta``
  device or ``FakeTensor`` s (``torch._subclasses.FakeTensorMode``), as torch's
  memory estimators (``torch.distributed._tools``) and deferred-init tools trace a
  training step. Nothing can be read on the host, so the non-finite screen is
  skipped (there is nothing to screen) and every solver decision stays on the
  device (:func:`matroot._xp.host_reads_off`): the state gets the shapes and dtypes
  a real step gives it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from ... import _xp

__all__ = ["refuse_valueless", "step_context"]


def _firsts(param_groups: Sequence[dict]) -> list:
    """The first parameter of each group: a model is traced, or autocast, as a whole,
    so these are looked at, not every parameter at every step."""
    return [g["params"][0] for g in param_groups if g["params"]]


def _valueless(param_groups: Sequence[dict]) -> bool:
    # Under torch.compile the step's tensors are the compiler's; nothing to decide.
    return not torch.compiler.is_compiling() and any(
        _xp.holds_no_values(p) for p in _firsts(param_groups))


def step_context(param_groups: Sequence[dict]) -> contextlib.AbstractContextManager:
    """Autocast off for the parameters' device types, and host reads off where the
    parameters hold no values; nothing under ``torch.compile`` (an ``ExitStack`` breaks
    its graph, and a compiled step runs as traced, autocast or not).

    Examples
    --------
    >>> import torch
    >>> from matroot import _xp
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     with step_context([{"params": [torch.zeros(2, device="meta")]}]):
    ...         print(_xp.is_traced(torch.zeros(2)))
    ...     with step_context([{"params": [torch.zeros(2)]}]):
    ...         print(torch.is_autocast_enabled("cpu"), _xp.is_traced(torch.zeros(2)))
    True
    False False
    """
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for device_type in sorted({p.device.type for p in _firsts(param_groups)}):
        if torch.amp.is_autocast_available(device_type) and \
                torch.is_autocast_enabled(device_type):
            stack.enter_context(torch.autocast(device_type, enabled=False))
    if _valueless(param_groups):
        stack.enter_context(_xp.host_reads_off())
    return stack


def refuse_valueless(param_groups: Sequence[dict], optimizer: str) -> None:
    """A clear error for an optimizer whose step must read values on the host.

    Raises
    ------
    ValueError
        Where the groups' parameters are on the ``meta`` device or ``FakeTensor`` s.

    Examples
    --------
    >>> import torch
    >>> refuse_valueless([{"params": [torch.zeros(2)]}], "SOAP")
    >>> refuse_valueless([{"params": [torch.zeros(2, device="meta")]}], "SOAP")
    Traceback (most recent call last):
    ...
    ValueError: SOAP cannot step parameters that hold no values (torch's meta device ...
    """
    if _valueless(param_groups):
        raise ValueError(
            f"{optimizer} cannot step parameters that hold no values (torch's meta device "
            "or a FakeTensor): its eigenbasis refresh reads values on the host; step it "
            "on real tensors (materialize the model first, e.g. model.to_empty(device=...))")
