"""The host side of a :class:`matroot.optim.Shampoo` step, run eagerly even inside
``torch.compile``: gradients checked, families formed, the groups' hyperparameters read,
each family's root schedule advanced, non-finite gradients screened (a mixin: it reads
the optimizer's families, groups and process group)."""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..distributed.core import agree_on_gradients
from ..distributed.dtensor import local_view, whole
from ..shampoo_core import core
from ..shampoo_core.gradients import apply_nonfinite_policy, nonfinite_params
from .state import host_number

__all__ = ["StepPreparation"]

#: How a step's non-finite gradients are screened (:meth:`Shampoo._prepare_step`): on the
#: device (no host read), found finite on the host, or found and the step skipped.
_ON_DEVICE, _FINITE, _SKIPPED = "device", "finite", "skipped"


class _Job(NamedTuple):
    """What one family's step needs from the host: config, per-parameter ``lr`` and
    ``weight_decay``, and ``(refresh, started)``."""

    config: core.ShampooConfig
    lrs: list
    decays: list
    schedule: tuple



class StepPreparation:
    """:meth:`_prepare_step` and the gradient screen of :class:`matroot.optim.Shampoo`."""

    if TYPE_CHECKING:   # what the optimizer it is mixed into provides
        _families: list
        _process_group: Any

        def _all_params(self) -> list: ...

        def _group_of(self) -> dict: ...

        def _form_families(self) -> None: ...

        def _family_config(self, family, group_of) -> core.ShampooConfig: ...

    @torch.compiler.disable
    def _prepare_step(self):
        """The host side of a step, run eagerly even inside ``torch.compile``.

        Checks the gradients' kinds, forms families, reads the groups'
        hyperparameters and advances each family's host-side schedule, so the
        compiled part of the step sees the same Python values at every step
        (no recompiles). Where a group says ``nonfinite_grads="raise"`` or the
        blocks are sharded, the gradients are checked here (one host read);
        otherwise the check is left to the device.

        Gradients of DTensor parameters are checked on their local parts when
        the blocks are sharded (the check is a collective, so a gradient missing
        on some ranks raises before any rank waits in a gather), then gathered
        whole (:func:`~matroot.optim.distributed.dtensor.whole`), so every rank updates
        from the same values.

        Returns
        -------
        jobs : list of _Job or None, or None
            Per family (None where no parameter has a gradient); None when there
            is nothing to update.
        grads : list of lists of tensors or None
            Per family, its parameters' whole gradients.
        screen : str
            ``"device"``: the update finds non-finite gradients itself (no host
            read); ``"finite"``: found finite here; ``"skipped"``: non-finite
            gradients found here in "skip" groups, the step runs skipped.
        """
        for p in self._all_params():
            if p.grad is not None and p.grad.is_sparse:
                raise TypeError("Shampoo does not support sparse gradients (an Embedding made "
                                "with sparse=True): make it dense")
        self._form_families()
        group_of = self._group_of()
        on_device = self._process_group is None and all(
            group_of[id(p)]["nonfinite_grads"] == "skip"
            for family in self._families for p in family.params)
        grads = [[None if p.grad is None else p.grad.detach() for p in family.params]
                 for family in self._families]
        bad: list = []
        if not on_device and self._process_group is not None:
            bad = self._nonfinite_params([[None if g is None else local_view(g) for g in fam]
                                          for fam in grads])
        grads = [[whole(g) for g in fam] for fam in grads]
        if not on_device and self._process_group is None:
            bad = self._nonfinite_params(grads)
        params = self._all_params()
        skipped = apply_nonfinite_policy(
            bad, lambda i: group_of[id(params[i])]["nonfinite_grads"],
            numbering=" (state_dict numbering)")
        # One rule for a skipped step, wherever it is found: it runs as a step whose
        # flag says "skip" (state and parameters untouched, skipped_steps counted), and
        # it counts in the root schedule of every family with a gradient, as a step
        # skipped on the device must (its schedule is fixed before the flag is known).
        screen = _ON_DEVICE if on_device else (_SKIPPED if skipped else _FINITE)
        jobs: list[_Job | None] = []
        for family, fam_grads in zip(self._families, grads):
            if all(g is None for g in fam_grads):
                jobs.append(None)
                continue
            config = self._family_config(family, group_of)
            if config != family.config:
                family.config = config
            groups = [group_of[id(p)] for p in family.params]
            family.schedule_step += 1
            family.note_present([g is not None for g in fam_grads])
            jobs.append(_Job(family.config, [host_number(g["lr"]) for g in groups],
                             [host_number(g["weight_decay"]) for g in groups],
                             family.config.schedule_at(family.schedule_step)))
        return (jobs if any(jobs) else None), grads, screen

    def _nonfinite_params(self, grads) -> list:
        """state_dict numbers of parameters with NaN/Inf gradients (on any rank when sharded)."""
        members = [p for f in self._families for p in f.params]
        flat = list(chain.from_iterable(grads))
        if not members:
            return []
        if self._process_group is not None:
            flags = agree_on_gradients(flat, self._process_group, members[0].device)
        else:
            bad = set(nonfinite_params(torch, flat))
            if not bad:
                return []
            flags = [i in bad for i in range(len(flat))]
        index = {id(p): i for i, p in enumerate(self._all_params())}
        return sorted(index[id(p)] for p, bad in zip(members, flags) if bad)
