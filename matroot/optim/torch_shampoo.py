"""``matroot.optim.Shampoo``: a ``torch.optim.Optimizer`` around the functional core.

The shell maps torch's parameter groups onto the core: parameters whose groups
agree on every hyperparameter except the per-parameter ones
(:data:`~matroot.optim.config.PER_PARAMETER`: ``lr``, ``weight_decay`` and the
per-dimension policy) share one set of factor stacks (a *family*), so the whole
model's equal-size factors are solved by one ``inv_root`` call per size; ``lr``
and ``weight_decay`` are read per group at every step, so LR schedulers work.
Trainable parameters get a family at the first step (frozen ones none), so a
group added after training started, or a parameter unfrozen later, gets a
family of its own (its own step count and stacks).

Per-parameter state (``step``, ``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``)
lives in ``optimizer.state[p]`` as in torch's own optimizers, made at the
parameter's first gradient; the factor and root stacks live with their family
and travel in ``state_dict()["shampoo_families"]`` with a per-parameter index of
their slots (:mod:`matroot.optim.checkpoint`).

Every counter a step advances is a 0-d tensor on the parameters' device (``step``
float64, as exact in ``1 − βᵗ`` as a Python int; the family counters int64), so
``torch.compile(opt.step)`` bakes no count into its graph. The root schedule is
a host-side count per family, read only in :meth:`Shampoo._prepare_step`, which
runs outside any compiled graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from . import core
from .checkpoint import FORMAT, plan_from_layout, plan_layout
from .config import PER_PARAMETER
from .distributed import (
    BlockSharding,
    agree_on_gradients,
    check_shard,
    resolve_process_group,
)
from .dtensor import add_to_local, is_dtensor, local_view, whole
from .preconditioner import factor_shape

__all__ = ["Shampoo"]

_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(core.ShampooConfig))
_DEFAULTS = core.ShampooConfig()
_STATE_KEYS = ("exp_avg", "exp_avg_sq", "momentum_buffer")
#: dtype of the per-parameter ``step`` tensors (bias corrections in float64).
STEP_DTYPE = torch.float64


def _device_counters(state: core.ShampooState, device) -> core.ShampooState:
    """The family counters of ``state`` as int64 tensors on ``device``."""
    def counter(value):
        return torch.as_tensor(int(value), dtype=torch.int64, device=device)

    return state._replace(step=counter(state.step), root_refreshes=counter(state.root_refreshes),
                          skipped_steps=counter(state.skipped_steps))


def _step_tensor(value, device) -> torch.Tensor:
    """A per-parameter step count (an int from an older state dict, or a tensor) as
    a 0-d :data:`STEP_DTYPE` tensor on ``device``."""
    return torch.as_tensor(value, dtype=STEP_DTYPE, device=device).reshape(())


class _Family:
    """Parameters that share factor stacks, their core state and, when sharded, their split.

    ``schedule_step`` counts the steps that reached the update on the host (steps
    skipped on the device included) and drives the root schedule; ``config`` is the
    last config the family stepped with (the same object while it is unchanged).
    """

    def __init__(self, params, state: core.ShampooState, sharding=None, schedule_step=None):
        self.params = params
        self.state = _device_counters(state, params[0].device)
        self.sharding = sharding
        self.schedule_step = int(state.step) if schedule_step is None else int(schedule_step)
        self.config: core.ShampooConfig | None = None


class _Job(NamedTuple):
    """What one family's step needs from the host: config, per-parameter ``lr`` and
    ``weight_decay``, and ``(refresh, started)``."""

    config: core.ShampooConfig
    lrs: list
    decays: list
    schedule: tuple


class Shampoo(torch.optim.Optimizer):
    """Stacked-block Shampoo with grafting, as a ``torch.optim.Optimizer``.

    Weights are cut into blocks of at most ``block_size``; the Kronecker factors
    of all blocks of the model are kept in one ``(b, n, n)`` stack per size and
    their inverse roots computed by one :func:`matroot.inv_root` call per stack.
    Each block's Shampoo direction is rescaled to the norm of its grafting (Adam
    by default) direction; before ``start_preconditioning_step``, and for
    parameters without factors, the update is the grafting one (AdamW's).

    Parameters
    ----------
    params : iterable of tensors or dicts
        Parameters or parameter groups; any hyperparameter may be set per group.
    distributed : "auto", None or ProcessGroup
        ``"auto"``: when ``torch.distributed`` is initialised with more than one
        rank, split the blocks over its ranks (see :mod:`matroot.optim.distributed`
        and docs/distributed.rst); None: never.
    graft_only : callable, optional
        ``graft_only(param) -> bool``: True keeps that parameter on the grafting
        update with no factors (per parameter; per group, set ``precondition=False``).
    **hyperparameters
        Any :class:`matroot.optim.ShampooConfig` field (``lr``, ``betas``,
        ``weight_decay``, ``block_size``, ...), its defaults and validation.

    Notes
    -----
    With ``nonfinite_grads="skip"`` a step reads nothing on the host: NaN/Inf
    gradients are found on the device and the step is skipped there. With
    ``"raise"`` (the default) and under ``torch.distributed``, one host read per
    step checks them first. A root refresh reads the host for the solver's
    convergence checks. ``torch.compile(opt.step)`` works; the root refresh runs
    outside its graph (docs/optimizer.rst, "Compiling the optimizer step").
    Moments and factors of bfloat16/float16 parameters are float32 and stay
    float32 through ``state_dict()``/``load_state_dict()``.

    Examples
    --------
    >>> import torch
    >>> from matroot.optim import Shampoo
    >>> model = torch.nn.Linear(8, 4)
    >>> opt = Shampoo(model.parameters(), lr=1e-2, precondition_frequency=5)
    >>> x, y = torch.randn(32, 8), torch.randn(32, 4)
    >>> for _ in range(10):
    ...     opt.zero_grad()
    ...     torch.nn.functional.mse_loss(model(x), y).backward()
    ...     opt.step()
    >>> opt.diagnostics()["root_refreshes"]
    2
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]], *,
                 distributed: str | dist.ProcessGroup | None = "auto",
                 graft_only: Callable[[torch.Tensor], bool] | None = None,
                 **hyperparameters: Any) -> None:
        config = core.ShampooConfig(**hyperparameters)
        defaults = {name: getattr(config, name) for name in _CONFIG_FIELDS}
        self._families: list[_Family] = []
        self._process_group = resolve_process_group(distributed)
        self._graft_only = graft_only
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        """Add a group (validated now; its parameters get their own stacks at the next step)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if not p.is_floating_point():
                raise TypeError(f"Shampoo optimizes floating parameters, got dtype {p.dtype}")
        self._group_config(group)

    @staticmethod
    def _group_config(group) -> core.ShampooConfig:
        return core.ShampooConfig(**{name: group[name] for name in _CONFIG_FIELDS})

    @staticmethod
    def _shared(config: core.ShampooConfig) -> core.ShampooConfig:
        """The part of a config that parameters sharing factor stacks must agree on."""
        return dataclasses.replace(config, **{f: getattr(_DEFAULTS, f) for f in PER_PARAMETER})

    def _all_params(self):
        return list(chain.from_iterable(g["params"] for g in self.param_groups))

    def _group_of(self):
        return {id(p): g for g in self.param_groups for p in g["params"]}

    def _family_config(self, family, group_of) -> core.ShampooConfig:
        groups = {id(group_of[id(p)]): group_of[id(p)] for p in family.params}
        configs = [self._group_config(g) for g in groups.values()]
        shared = self._shared(configs[0])
        for config in configs[1:]:
            if self._shared(config) != shared:
                raise ValueError(
                    "parameter groups that share Shampoo factor stacks must keep equal "
                    f"hyperparameters other than {', '.join(PER_PARAMETER)}; changed after "
                    f"the first step: {shared} vs {config}")
        return configs[0]

    def _policy(self, p, group):
        policy = self._group_config(group).factor_policy
        if self._graft_only is not None and self._graft_only(p):
            policy = dataclasses.replace(policy, precondition=False)
        return policy

    def _form_families(self):
        """Give every trainable parameter without a family one, grouping by shared settings.

        Frozen parameters (``requires_grad=False``) get none; their state arrays, like
        everyone's, are only made by the first step with a gradient (a lazy core state).
        """
        owned = {id(p) for f in self._families for p in f.params}
        pending: list[tuple[core.ShampooConfig, torch.device, list, list]] = []
        for group in self.param_groups:
            shared = self._shared(self._group_config(group))
            for p in group["params"]:
                if id(p) in owned or not p.requires_grad:
                    continue
                for config, device, members, policies in pending:
                    if config == shared and device == p.device:
                        members.append(p)
                        policies.append(self._policy(p, group))
                        break
                else:
                    pending.append((shared, p.device, [p], [self._policy(p, group)]))
        for config, _, members, policies in pending:
            plan = core.make_plan([p.detach() for p in members], config, policies=policies)
            self._families.append(self._new_family(members, config, plan))

    def _new_family(self, members, config, plan) -> _Family:
        detached = [p.detach() for p in members]
        if self._process_group is None:
            return _Family(members, core.init(detached, config, plan=plan, lazy=True))
        sharding = BlockSharding(plan, self._process_group)
        return _Family(members, core.init(detached, config, plan=sharding.local, lazy=True),
                       sharding)

    def _sync_family_state(self, family):
        """The family's core state with the per-parameter entries of ``self.state``."""
        per_param = [self.state.get(p, {}) for p in family.params]
        family.state = family.state._replace(
            param_steps=tuple(s["step"] if "step" in s else
                              torch.zeros((), dtype=STEP_DTYPE, device=p.device)
                              for p, s in zip(family.params, per_param)),
            **{key: [s.get(key) for s in per_param] for key in _STATE_KEYS})

    def _publish_family_state(self, family):
        """Per-parameter entries of ``self.state`` from the family's core state."""
        st = family.state
        buffers = st.momentum_buffer or [None] * len(family.params)
        for p, t, *arrays in zip(family.params, st.param_steps, st.exp_avg, st.exp_avg_sq,
                                 buffers):
            if arrays[0] is not None:
                self.state[p] = {"step": t, **{k: a for k, a in zip(_STATE_KEYS, arrays)
                                               if a is not None}}

    @torch.no_grad()
    def step(self, closure=None):
        """Take one optimization step; ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        jobs, grads, check_on_device = self._prepare_step()
        if jobs is None:
            return loss
        if any(job is not None and job.schedule[0] for job in jobs):
            self._update_outside_graph(jobs, grads, check_on_device)
        else:
            self._update(jobs, grads, check_on_device)
        return loss

    def _update(self, jobs, grads, check_on_device: bool) -> None:
        """The device side of a step: every family's core update, applied to the parameters.

        ``grads`` are whole gradients (:func:`~matroot.optim.dtensor.whole`), per family.
        """
        finite = core.all_finite(list(chain.from_iterable(grads))) if check_on_device else None
        for family, fam_grads, job in zip(self._families, grads, jobs):
            if job is None:
                continue
            self._sync_family_state(family)
            # A DTensor parameter is gathered only where weight decay reads it.
            params = [whole(p.detach()) if decay or not is_dtensor(p) else None
                      for p, decay in zip(family.params, job.decays)]
            updates, family.state = core.update(
                fam_grads, family.state, params, job.config,
                lr=job.lrs, weight_decay=job.decays, check_grads=False, in_place=True,
                schedule=job.schedule, finite=finite)
            self._publish_family_state(family)
            if family.sharding is not None:
                family.sharding.share_updates(updates)
            for p, u in zip(family.params, updates):
                if u is not None:
                    add_to_local(p, u)

    # A step with a root refresh runs eagerly under torch.compile: the solvers' convergence
    # checks read the host, and a graph break inside the families' loop would leave the
    # whole loop uncompiled. Steps without one stay in one graph.
    _update_outside_graph = torch.compiler.disable(_update)

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
        whole (:func:`~matroot.optim.dtensor.whole`), so every rank updates
        from the same values.

        Returns
        -------
        jobs : list of _Job or None, or None
            Per family (None where no parameter has a gradient); None when there
            is nothing to update (no gradients, or a step skipped for NaN/Inf).
        grads : list of lists of tensors or None
            Per family, its parameters' whole gradients.
        check_on_device : bool
        """
        for p in self._all_params():
            if p.grad is not None and p.grad.is_sparse:
                raise TypeError("Shampoo does not support sparse gradients")
        self._form_families()
        group_of = self._group_of()
        check_on_device = self._process_group is None and all(
            group_of[id(p)]["nonfinite_grads"] == "skip"
            for family in self._families for p in family.params)
        grads = [[None if p.grad is None else p.grad.detach() for p in family.params]
                 for family in self._families]
        bad: list = []
        if not check_on_device and self._process_group is not None:
            bad = self._nonfinite_params([[None if g is None else local_view(g) for g in fam]
                                          for fam in grads])
        grads = [[whole(g) for g in fam] for fam in grads]
        if not check_on_device and self._process_group is None:
            bad = self._nonfinite_params(grads)
        if bad:
            params = self._all_params()
            if any(group_of[id(params[i])]["nonfinite_grads"] == "raise" for i in bad):
                raise core.NonFiniteGradientError(
                    f"gradients of parameters {bad} (state_dict numbering) contain NaN or "
                    "Inf; pass nonfinite_grads='skip' to skip such steps instead")
            for family in self._families:
                family.state = family.state._replace(
                    skipped_steps=family.state.skipped_steps + 1)
            return None, grads, check_on_device
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
            jobs.append(_Job(family.config, [g["lr"] for g in groups],
                             [g["weight_decay"] for g in groups],
                             family.config.schedule_at(family.schedule_step)))
        return (jobs if any(jobs) else None), grads, check_on_device

    def _nonfinite_params(self, grads) -> list:
        """state_dict numbers of parameters with NaN/Inf gradients (on any rank when sharded)."""
        members = [p for f in self._families for p in f.params]
        flat = list(chain.from_iterable(grads))
        if not members:
            return []
        if self._process_group is not None:
            flags = agree_on_gradients(flat, self._process_group, members[0].device)
        else:
            flags = core.nonfinite_flags(flat)
        index = {id(p): i for i, p in enumerate(self._all_params())}
        return sorted(index[id(p)] for p, bad in zip(members, flags) if bad)

    def diagnostics(self) -> dict:
        """Counters and memory of the optimizer state, summed over families.

        Returns
        -------
        dict
            ``steps`` (of the first family), ``root_refreshes``, ``root_failures``
            (rejected roots, all refreshes), ``skipped_steps``, ``stacks``,
            ``blocks``, ``state_bytes`` and ``state_bytes_per_parameter`` (over
            the parameters that have state).
        """
        out: dict[str, float] = {
            "steps": 0, "root_refreshes": 0, "root_failures": 0, "skipped_steps": 0,
            "stacks": 0, "blocks": 0, "state_bytes": 0, "parameters": 0}
        for i, family in enumerate(self._families):
            self._sync_family_state(family)
            st = family.state
            if i == 0:
                out["steps"] = int(st.step)
            out["root_refreshes"] += int(st.root_refreshes)
            out["root_failures"] += sum(int(f.sum()) for f in st.root_failures if f is not None)
            out["skipped_steps"] += int(st.skipped_steps)
            out["stacks"] += len(st.plan.stacks)
            out["blocks"] += st.plan.num_blocks
            out["state_bytes"] += core.state_bytes(st)["total"]
            out["parameters"] += sum(p.numel() for p in family.params)
        out["state_bytes_per_parameter"] = (out["state_bytes"] / out["parameters"]
                                            if out["parameters"] else 0.0)
        return out

    def _family_records(self) -> list:
        """Each family's stacks, counters and the per-parameter ``"layout"`` index of their
        slots (:mod:`matroot.optim.checkpoint`), parameters numbered in group order."""
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
                      "root_failures": list(f.state.root_failures)}
            if f.sharding is not None:
                record["shard"] = f.sharding.record()
            records.append(record)
        return records

    def state_dict(self):
        """torch's state dict plus ``"shampoo_families"``: each family's stacks, counters and
        the per-parameter ``"layout"`` index of their slots (:mod:`matroot.optim.checkpoint`)."""
        sd = super().state_dict()
        sd["shampoo_families"] = self._family_records()
        return sd

    def _stacked(self, family) -> bool:
        return bool(self._group_of()[id(family.params[0])]["stacked"])

    def load_state_dict(self, state_dict):
        """Restore a state dict exactly, keeping float32 state of 16-bit parameters float32.

        torch's loader casts floating state to each parameter's dtype; the saved
        tensors are put back with their own dtype before torch runs the load
        post-hooks (so what a hook writes stays), and continuing after a reload is
        bit-identical to continuing without one. Keys of ``"state"`` that are not
        parameter numbers are kept as they are, as torch keeps them. State dicts of
        the first format (no ``"layout"``; hyperparameters added since then take
        this optimizer's values) load too.

        Raises
        ------
        ValueError
            As torch does for a different number of parameter groups or of
            parameters in a group; for families whose layout does not fit the
            parameters, or a shard of another rank or world size.
        """
        state_dict = dict(state_dict)
        saved_groups = list(state_dict["param_groups"])
        # Hyperparameters the saved groups predate take this optimizer's values.
        state_dict["param_groups"] = [
            {**{k: v for k, v in current.items() if k != "params"}, **group}
            for current, group in zip(self.param_groups, saved_groups)
        ] + saved_groups[len(self.param_groups):]
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
                             "sharded": self._process_group is not None}}

    def _finish_load(self, state_dict) -> None:
        """Put back the saved tensors of ``state_dict`` uncast and rebuild the families."""
        saved_groups = state_dict["param_groups"]
        params = self._all_params()
        by_number = dict(zip(chain.from_iterable(g["params"] for g in saved_groups), params))
        for key, entries in state_dict.get("state", {}).items():
            p = by_number.get(key)
            if p is None:
                continue        # not a parameter: kept by torch as it was
            self.state[p] = {k: (v.detach().to(device=p.device, copy=True)
                                 if torch.is_tensor(v) else v) for k, v in entries.items()}
            if "step" in self.state[p]:
                self.state[p]["step"] = _step_tensor(self.state[p]["step"], p.device)
        self._families = [self._restore_family(record, params)
                          for record in state_dict.get("shampoo_families", [])]

    def _restore_family(self, record, params) -> _Family:
        members = [params[i] for i in record["params"]]
        group = self._group_of()[id(members[0])]
        config = self._group_config(group)
        if "layout" in record:
            plan = plan_from_layout(record["layout"], block_size=record["block_size"],
                                    stacked=record["stacked"])
            if [layout.shape for layout in plan.params] != [tuple(p.shape) for p in members]:
                raise ValueError("the state dict's layout does not fit the parameters' shapes")
        else:
            plan = core.make_plan([p.detach() for p in members], config)
        sharding = None if self._process_group is None else \
            BlockSharding(plan, self._process_group)
        check_shard(record.get("shard"), sharding)
        plan = plan if sharding is None else sharding.local
        device = members[0].device
        stacks = [factor_shape(s, config.symmetric_packing) for s in plan.stacks]

        def restore(name, shapes):
            arrays = record[name]
            found = [None if a is None else tuple(a.shape) for a in arrays]
            if any(f is not None and f != s for f, s in zip(found, shapes)) or \
                    len(found) != len(shapes):
                raise ValueError(f"state dict {name} stacks {found} do not fit the "
                                 f"parameters' block plan {shapes}")
            return [None if a is None else a.detach().to(device=device, copy=True)
                    for a in arrays]

        state = core.ShampooState(
            step=int(record["step"]), param_steps=(0,) * len(members), exp_avg=[],
            exp_avg_sq=[], factors=restore("factors", stacks), roots=restore("roots", stacks),
            root_failures=restore("root_failures", [(s.count,) for s in plan.stacks]),
            root_refreshes=int(record["root_refreshes"]),
            skipped_steps=int(record["skipped_steps"]), plan=plan)
        family = _Family(members, state, sharding,
                         schedule_step=record.get("schedule_step", record["step"]))
        self._sync_family_state(family)
        return family
