"""The torch shell's state: parameter families, and the state dict and pickle round trips.

:class:`matroot.optim.Shampoo` keeps one :class:`_Family` per set of parameters
that share factor stacks. :class:`ShampooStateDict` is the part of the shell that
saves and restores them: ``state_dict()`` adds each family's stacks, counters and
per-parameter ``"layout"`` (:mod:`matroot.optim.shampoo_core.checkpoint`) to torch's state dict;
``load_state_dict()`` puts them back, in the dtypes a fresh optimizer of the
parameters keeps, before torch runs the load post-hooks; ``pickle`` and
``copy.deepcopy`` carry the same records. It also moves a family's per-parameter
entries of ``optimizer.state`` into its core state and back at each step (sharded:
the moments of the rank's pieces, as views into the elements it keeps of each
parameter, :mod:`matroot.optim.distributed.rank_part`).
"""

from __future__ import annotations

import dataclasses
import math
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ... import _xp
from ..shampoo_core import core
from ..shampoo_core.checkpoint import FORMAT, plan_from_layout, plan_layout
from ..distributed.core import BlockSharding, check_shard, resolve_process_group
from ..shampoo_core.preconditioner import factor_shape
from ..distributed.rank_part import MOMENT_KEYS, kept_piece, own_part
from .family import _Family

__all__ = ["STEP_DTYPE", "ShampooStateDict", "host_number", "with_missing_group_keys"]

#: dtype of the per-parameter ``step`` tensors (bias corrections in float64).
STEP_DTYPE = torch.float64


def _step_tensor(value, device) -> torch.Tensor:
    """A per-parameter step count (an int from an older state dict, or a tensor) as
    a 0-d :data:`STEP_DTYPE` tensor on ``device``."""
    # A copy: the step advances in place, and the loaded state dict's tensor (torch's
    # loader passes "step" through as it is) may still be another optimizer's.
    return torch.as_tensor(value, dtype=STEP_DTYPE, device=device).reshape(()).clone()


def _loaded_entry(key, value, device, dtype):
    """One saved entry of ``optimizer.state[p]`` as a fresh optimizer would hold it:
    on the parameter's device, ``step`` a :data:`STEP_DTYPE` count, other floating
    tensors in the parameter's moment dtype ``dtype`` (torch's loader casts them to
    the parameter's dtype; Shampoo keeps 16-bit parameters' moments float32)."""
    if key == "step":
        return _step_tensor(value, device)
    if not torch.is_tensor(value):
        return value
    return value.detach().to(device=device, copy=True,
                             dtype=dtype if value.is_floating_point() else None)


def with_missing_group_keys(state_dict, param_groups):
    """``state_dict`` whose saved groups take ``param_groups``' values of the keys they
    lack (hyperparameters they predate, or another optimizer's checkpoint): torch's
    loader replaces each group by the saved one whole.

    Examples
    --------
    >>> with_missing_group_keys({"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
    ...                         [{"lr": 0.2, "use_muon": True, "params": []}])["param_groups"]
    [{'lr': 0.1, 'use_muon': True, 'params': [0]}]
    """
    saved_groups = list(state_dict["param_groups"])
    return {**state_dict, "param_groups": [
        {**{k: v for k, v in current.items() if k != "params"}, **group}
        for current, group in zip(param_groups, saved_groups)
    ] + saved_groups[len(param_groups):]}


def host_number(value):
    """A one-element tensor hyperparameter of a group as the Python number the config
    validates (torch's optimizers take ``lr=torch.tensor(...)``, and schedulers then
    ``fill_`` it; Adam's ``betas`` may be a pair of them), a tuple or list of values
    element by element, any other value as it is. One host read per tensor on a
    device."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (tuple, list)):
        return type(value)(host_number(v) for v in value)
    return value


def update_dtypes(params) -> list[str]:
    """Each parameter's update (and moment) dtype name, as the core computes it."""
    return [core.compute_dtype_name(_xp.array_namespace(p.detach()), p.dtype) for p in params]


def _plan_for_members(record, members):
    """The block plan of a saved family record for its (maybe retyped) parameters.

    The saved layout fixes blocks and slots; the factors' dtype is the one a fresh
    optimizer gives the parameters now (a float32 checkpoint loaded into a float64
    model keeps float64 factors), provided that moves no block to another slot.
    """
    saved = record["layout"]
    if [list(entry["shape"]) for entry in saved] != [list(p.shape) for p in members]:
        raise ValueError("the state dict's layout does not fit the parameters' shapes")
    retyped = [{**entry, "dtype": None if entry["dtype"] is None else dtype}
               for entry, dtype in zip(saved, update_dtypes(members))]
    plan = plan_from_layout(retyped, block_size=record["block_size"],
                            stacked=record["stacked"])
    numbers = [entry["param"] for entry in saved]
    if plan_layout(plan, numbers) != retyped:
        raise ValueError(
            "the parameters' dtypes changed since the state dict was saved in a way that "
            "merges or reorders its factor stacks (parameters of different float dtypes "
            "shared them): load it into a model of the saved dtypes "
            f"({sorted({e['dtype'] for e in saved if e['dtype']})}), then convert the model")
    return plan


class ShampooStateDict:
    """State dict, load and pickle support of :class:`matroot.optim.Shampoo` (a mixin:
    it reads the optimizer's families, parameter groups and process group)."""

    if TYPE_CHECKING:   # what the optimizer it is mixed into provides
        state: Any
        _families: list[_Family]
        _process_group: Any
        _graft_only: Any

        def _all_params(self) -> list: ...

        def _group_of(self) -> dict: ...

        def _group_config(self, group) -> core.ShampooConfig: ...

        def _planned_settings(self, params, group_of) -> list: ...

    def _sync_family_state(self, family):
        """The family's core state with the per-parameter entries of ``self.state``
        (sharded: one entry per piece, views into the parameter's kept moments)."""
        per_param = [self.state.get(p, {}) for p in family.params]
        sharding = family.sharding
        if sharding is None:
            steps = [s.get("step") for s in per_param]
            arrays = {key: [s.get(key) for s in per_param] for key in MOMENT_KEYS}
        else:
            steps = [per_param[piece.param].get("step") for piece in sharding.pieces]
            arrays = {key: [None if key not in per_param[piece.param] else kept_piece(
                per_param[piece.param][key], piece, sharding.plan.params[piece.param])
                for piece in sharding.pieces] for key in MOMENT_KEYS}
        device = family.params[0].device
        if family.uniform_steps:
            shared = next((t for t in steps if t is not None), None)
            if shared is None:
                shared = torch.zeros((), dtype=STEP_DTYPE, device=device)
            param_steps = (shared,) * len(steps)
        else:
            param_steps = tuple(torch.zeros((), dtype=STEP_DTYPE, device=device)
                                if t is None else t for t in steps)
        family.state = family.state._replace(param_steps=param_steps, **arrays)

    def _publish_family_state(self, family):
        """Per-parameter entries of ``self.state`` from the family's core state (sharded:
        the pieces' moments written into the parameter's kept moments, made at its first
        gradient)."""
        st = family.state
        buffers = st.momentum_buffer or [None] * len(st.exp_avg)
        entries = zip(st.param_steps, st.exp_avg, st.exp_avg_sq, buffers)
        if family.sharding is None:
            for p, (t, *arrays) in zip(family.params, entries):
                if arrays[0] is not None:
                    self.state[p] = {"step": t, **{k: a for k, a in zip(MOMENT_KEYS, arrays)
                                                   if a is not None}}
            return
        sharding = family.sharding
        for piece, (t, *arrays) in zip(sharding.pieces, entries):
            if arrays[0] is None:
                continue
            p = family.params[piece.param]
            layout = sharding.plan.params[piece.param]
            entry = self.state.setdefault(p, {})
            entry["step"] = t
            for key, array in zip(MOMENT_KEYS, arrays):
                if array is None:
                    continue
                if key not in entry:
                    size = sum(q.size for q in sharding.pieces_of(piece.param))
                    entry[key] = torch.zeros(layout.shape if size == math.prod(layout.shape)
                                             else (size,), dtype=array.dtype,
                                             device=array.device)
                kept = kept_piece(entry[key], piece, layout)
                if kept.data_ptr() != array.data_ptr():      # made by this step
                    kept.copy_(array)

    def _family_records(self) -> list:
        """Each family's stacks, counters and the per-parameter ``"layout"`` index of their
        slots (:mod:`matroot.optim.shampoo_core.checkpoint`), parameters numbered in group order."""
        index = {id(p): i for i, p in enumerate(self._all_params())}
        records = []
        for f in self._families:
            numbers = [index[id(p)] for p in f.params]
            plan = f.state.plan if f.sharding is None else f.sharding.plan
            record = {"format": FORMAT, "params": numbers, "step": int(f.state.step),
                      "schedule_step": f.schedule_step,
                      "root_refreshes": int(f.state.root_refreshes),
                      "skipped_steps": int(f.state.skipped_steps),
                      "block_size": plan.block_size, "stacked": self._stacked(f),
                      "layout": plan_layout(plan, numbers),
                      "factors": list(f.state.factors), "roots": list(f.state.roots),
                      "root_failures": list(f.state.root_failures),
                      "factor_bounds": list(f.state.factor_bounds or
                                            [None] * len(plan.stacks))}
            if f.sharding is not None:
                record["shard"] = f.sharding.record()
            records.append(record)
        return records

    def state_dict(self):
        """torch's state dict plus ``"shampoo_families"``: each family's stacks, counters and
        the per-parameter ``"layout"`` index of their slots
        (:mod:`matroot.optim.shampoo_core.checkpoint`)."""
        self._group_of()        # every family member still in a group, or a clear error
        sd = super().state_dict()
        sd["shampoo_families"] = self._family_records()
        return sd

    def _stacked(self, family) -> bool:
        return bool(self._group_of()[id(family.params[0])]["stacked"])

    def load_state_dict(self, state_dict):
        """Restore a state dict, each tensor in the dtype a fresh optimizer keeps it in.

        torch's loader casts floating state to each parameter's dtype; the saved
        tensors are put back before torch runs the load post-hooks (so what a hook
        writes stays), in the dtypes of this optimizer's parameters: moments and
        factors float32 for 16-bit parameters, float64 for float64 ones, roots in
        ``root_storage_dtype``, ``step`` float64 (docs/optimizer.rst). With the saved
        dtypes, continuing after a reload is bit-identical to continuing without one.
        Keys of ``"state"`` that are not parameter numbers are kept as they are, as
        torch keeps them. State dicts of the first format (no ``"layout"``;
        hyperparameters added since then take this optimizer's values) load too.

        Raises
        ------
        ValueError
            As torch does for a different number of parameter groups or of
            parameters in a group; for families whose layout does not fit the
            parameters (shapes, or dtypes changed so that stacks would merge), or
            a shard of another rank or world size.
        """
        state_dict = with_missing_group_keys(state_dict, self.param_groups)
        pending: dict = {}

        def capture(_, final):
            # Registered last: sees the state dict as the user's pre-hooks left it.
            pending["state_dict"] = final

        handle = self.register_load_state_dict_pre_hook(capture)
        self._pending_load = pending
        try:
            super().load_state_dict(state_dict)
        finally:
            handle.remove()
            del self._pending_load

    def __setstate__(self, state):
        """torch's ``__setstate__``, then Shampoo's own part: during
        :meth:`load_state_dict` the saved tensors and families, after unpickling
        (``pickle``, ``copy.deepcopy``) the families of :meth:`__getstate__`."""
        state = dict(state)
        shampoo = state.pop("_shampoo", None)
        super().__setstate__(state)
        pending = self.__dict__.get("_pending_load")
        if pending is not None:
            self._finish_load(pending["state_dict"])
        elif shampoo is not None:
            self._graft_only = shampoo["graft_only"]
            self._graph_replay = shampoo.get("graph_replay", "auto")
            self._process_group = resolve_process_group(
                "auto" if shampoo["sharded"] else None)
            params = self._all_params()
            self._families = [self._restore_family(r, params) for r in shampoo["families"]]

    def __getstate__(self):
        """torch's pickled state plus the families' stacks and counters (as records: a
        process group does not pickle; an optimizer sharded over the default group is
        sharded over the unpickling process's default group again)."""
        if self._process_group is not None and self._process_group != dist.group.WORLD:
            raise TypeError("a Shampoo sharded over a process group other than the default "
                            "one cannot be pickled or deep-copied; save its state_dict() and "
                            "load it into a new optimizer instead")
        return {**super().__getstate__(),
                "_shampoo": {"families": self._family_records(), "graft_only": self._graft_only,
                             "graph_replay": self.__dict__.get("_graph_replay", "auto"),
                             "sharded": self._process_group is not None}}

    def _finish_load(self, state_dict) -> None:
        """Put back the saved tensors of ``state_dict`` (:func:`_loaded_entry`) and rebuild
        the families."""
        saved_groups = state_dict["param_groups"]
        params = self._all_params()
        by_number = dict(zip(chain.from_iterable(g["params"] for g in saved_groups), params))
        for key, entries in state_dict.get("state", {}).items():
            p = by_number.get(key)
            if p is None:
                continue        # not a parameter: kept by torch as it was
            dtype = getattr(torch, update_dtypes([p])[0])
            self.state[p] = {k: _loaded_entry(k, v, p.device, dtype) for k, v in entries.items()}
        self._families = [self._restore_family(record, params)
                          for record in state_dict.get("shampoo_families", [])]

    def _restore_family(self, record, params) -> _Family:
        members = [params[i] for i in record["params"]]
        group = self._group_of()[id(members[0])]
        config = self._group_config(group)
        if "layout" in record:
            plan = _plan_for_members(record, members)
        else:   # the first format predates the factor-ratio rule: every factor
            plan = core.make_plan([p.detach() for p in members],
                                  dataclasses.replace(config, max_factor_ratio=math.inf))
        sharding = None if self._process_group is None else BlockSharding(
            plan, self._process_group, update_dtypes(members))
        check_shard(record.get("shard"), sharding)
        if sharding is not None:
            self._keep_own_moments(members, sharding)
        plan = plan if sharding is None else sharding.local
        device = members[0].device
        stacks = [factor_shape(s, config.symmetric_packing) for s in plan.stacks]
        # Floating stacks in the dtypes a fresh optimizer of these parameters keeps.
        dtypes_of = {"factors": [getattr(torch, s.dtype) for s in plan.stacks],
                     "factor_bounds": [getattr(torch, s.dtype) for s in plan.stacks],
                     "roots": [core.root_dtype(torch, config, s) for s in plan.stacks]}

        def restore(name, shapes):
            arrays = record[name]
            found = [None if a is None else tuple(a.shape) for a in arrays]
            if any(f is not None and f != s for f, s in zip(found, shapes)) or \
                    len(found) != len(shapes):
                raise ValueError(f"state dict {name} stacks {found} do not fit the "
                                 f"parameters' block plan {shapes}")
            dtypes = dtypes_of.get(name, [None] * len(arrays))
            return [None if a is None else a.detach().to(device=device, dtype=dtype, copy=True)
                    for a, dtype in zip(arrays, dtypes)]

        state = core.ShampooState(
            step=int(record["step"]), param_steps=(0,) * len(plan.params), exp_avg=[],
            exp_avg_sq=[], factors=restore("factors", stacks), roots=restore("roots", stacks),
            root_failures=restore("root_failures", [(s.count,) for s in plan.stacks]),
            root_refreshes=int(record["root_refreshes"]),
            skipped_steps=int(record["skipped_steps"]), plan=plan,
            # Saved before bounds were carried: unknown, found by the next refresh.
            factor_bounds=restore("factor_bounds", [(s.count, 2) for s in plan.stacks])
            if "factor_bounds" in record else None)
        family = _Family(members, state, sharding,
                         schedule_step=record.get("schedule_step", record["step"]))
        # The groups hold the saved hyperparameters now (torch's loader put them back).
        family.planned_settings = self._planned_settings(members, self._group_of())
        # Loading is no step: one host read of the saved counts says whether they agree.
        saved = [self.state.get(p, {}).get("step") for p in members]
        family.uniform_steps = all(t is None for t in saved) or (
            all(t is not None for t in saved) and len({float(t) for t in saved}) == 1)
        self._sync_family_state(family)
        return family

    def _keep_own_moments(self, members, sharding) -> None:
        """Moments loaded into a sharded optimizer, cut to the elements this rank owns:
        state dicts saved before a rank kept only those hold whole-parameter moments
        (and the elementwise parameters' on every rank)."""
        for i, p in enumerate(members):
            entry = self.state.get(p)
            if entry is None:
                continue
            pieces = sharding.pieces_of(i)
            if not pieces:
                del self.state[p]
                continue
            layout = sharding.plan.params[i]
            for key in MOMENT_KEYS:
                if key in entry:
                    entry[key] = own_part(entry[key], pieces, layout)
