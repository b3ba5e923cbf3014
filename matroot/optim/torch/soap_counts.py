"""The per-parameter step counts of :class:`matroot.optim.SOAP`'s families: Python ints
on the host, handed to the core as 0-d tensors when the step is compiled."""

from __future__ import annotations

import torch

from ..soap.state import SOAPState

__all__ = ["counted_steps", "steps_as_tensors"]


@torch.compiler.disable
def steps_as_tensors(family, grads) -> SOAPState:
    """The family's state with its per-parameter step counts as 0-d float64 tensors for
    the core, one per (count, has a gradient) pair, so equal counts share their bias
    corrections.

    Under ``torch.compile`` Python int counts that change at every step become symbols
    of the graph, and Inductor's foreach kernel of the bias corrections names a symbol
    it does not define (torch 2.13: ``NameError: name 's1' is not defined`` at the
    second compiled step); a tensor is an input like any other. The same tensors are
    refilled at every step (new ones would fail Dynamo's guards and recompile).
    Parameters that share a tensor advance together, so those with and without a
    gradient get their own.
    """
    device = next(g.device for g in grads if g is not None)
    keys = list(dict.fromkeys((int(s), g is not None)
                              for s, g in zip(family.state.param_steps, grads)))
    slots = family.step_slots
    slots.extend(torch.zeros((), dtype=torch.float64, device=device)
                 for _ in range(len(keys) - len(slots)))
    for slot, (count, _) in zip(slots, keys):
        slot.fill_(count)
    slot_of = dict(zip(keys, slots))
    return family.state._replace(param_steps=tuple(
        slot_of[int(s), g is not None] for s, g in zip(family.state.param_steps, grads)))


def counted_steps(before: SOAPState, after: SOAPState, grads) -> SOAPState:
    """``after`` with the per-parameter counts as Python ints again, known on the host
    without reading the tensors: one more for each parameter with a gradient, unless
    the screen skipped the step (then ``skipped_steps`` moved)."""
    skipped = after.skipped_steps != before.skipped_steps
    return after._replace(param_steps=tuple(
        int(s) + (g is not None and not skipped) for s, g in zip(before.param_steps, grads)))
