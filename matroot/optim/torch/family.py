"""A *family*: the parameters of :class:`matroot.optim.Shampoo` that share factor stacks,
with their core state (counters as 0-d tensors on the parameters' device), their
host-side root schedule and, when sharded, their split over ranks."""

from __future__ import annotations

import torch

from ..shampoo_core import core

__all__ = ["_Family"]


def _device_counters(state: core.ShampooState, device) -> core.ShampooState:
    """The family counters of ``state`` as int64 tensors on ``device``."""
    def counter(value):
        return torch.as_tensor(int(value), dtype=torch.int64, device=device)

    return state._replace(step=counter(state.step), root_refreshes=counter(state.root_refreshes),
                          skipped_steps=counter(state.skipped_steps))


class _Family:
    """Parameters that share factor stacks, their core state and, when sharded, their split.

    ``schedule_step`` counts the steps that reached the update on the host (steps
    skipped on the device included) and drives the root schedule; ``config`` is the
    last config the family stepped with (the same object while it is unchanged);
    ``planned_settings`` each parameter's group's settings that its blocks were
    planned (or loaded) with, which may not change.
    """

    def __init__(self, params, state: core.ShampooState, sharding=None, schedule_step=None):
        self.params = params
        self.state = _device_counters(state, params[0].device)
        self.sharding = sharding
        self.schedule_step = int(state.step) if schedule_step is None else int(schedule_step)
        self.config: core.ShampooConfig | None = None
        self.planned_settings: list = []
        #: Every member has had a gradient at exactly the same steps (known on the host),
        #: so their step counts are equal: they share one ``step`` tensor, and the bias
        #: corrections of the whole family come from it.
        self.uniform_steps = True

    def note_present(self, present) -> None:
        """A step in which the members in ``present`` have a gradient: counts that
        advance for some members and not others are no longer shared."""
        if not all(present):
            self.uniform_steps = False
