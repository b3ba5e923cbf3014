"""``matroot.optim.Shampoo``: a ``torch.optim.Optimizer`` around the functional core.

The shell maps torch's parameter groups onto the core: parameters whose groups
agree on every hyperparameter except the per-parameter ones
(:data:`~matroot.optim.shampoo_core.config.PER_PARAMETER`: ``lr``, ``weight_decay`` and the
per-dimension policy) share one set of factor stacks (a *family*), so the whole
model's equal-size factors are solved by one ``inv_root`` call per size; ``lr``
and ``weight_decay`` are read per group at every step, so LR schedulers work
(the per-dimension policy fixes a parameter's blocks at its first step).
Trainable parameters, and any with a ``.grad`` (as torch's optimizers update
them), get a family at the first step (frozen ones without a gradient none), so a
group added after training started, or a parameter unfrozen later, gets a
family of its own (its own step count and stacks).

Per-parameter state (``step``, ``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``)
lives in ``optimizer.state[p]`` as in torch's own optimizers, made at the
parameter's first gradient (sharded: on the ranks that own elements of it, for
those elements only); the factor and root stacks live with their family
and travel in ``state_dict()["shampoo_families"]`` with a per-parameter index of
their slots (:mod:`matroot.optim.shampoo_core.checkpoint`).

Every counter a step advances is a 0-d tensor on the parameters' device (``step``
float64, as exact in ``1 − βᵗ`` as a Python int; the family counters int64),
advanced in place, so ``torch.compile(opt.step)`` bakes no count into its graph and
a replayed CUDA graph advances them (:mod:`matroot.optim.torch.graph_replay`).
Parameters of a family that have had a gradient at the same steps share one
``step`` tensor (known on the host, no read), so the bias corrections of the whole
family come from it. The root schedule is a host-side count per family, read only
in :meth:`Shampoo._prepare_step`, which runs outside any compiled graph.

A step's device side works on lists and stacks, not parameter by parameter (the
per-stack step of docs/optimizer.rst): one foreach call per elementwise term, one
batched product per block shape, one foreach addition for the write-back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist

from ..shampoo_core import core
from ..shampoo_core.config import PER_PARAMETER, check_keywords
from ..distributed.core import (BlockSharding, agree_on_parameters,
                          resolve_process_group)
from ..distributed.dtensor import add_all_to_local, is_dtensor, local_view, whole
from ..shampoo_core import lists
from .closure import closure_loss
from .param_lists import listed_once
from .graph_replay import ReplayedSteps, StepGraphs
from .prepare import _ON_DEVICE, _SKIPPED, StepPreparation
from .state import ShampooStateDict, _Family, host_number, update_dtypes
from .step_context import step_context

__all__ = ["Shampoo"]

#: The config's keywords (its option groups are built from them, not passed).
_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(core.ShampooConfig) if f.init)


def _hashable(value):
    """A group's hyperparameter values as a dict key (options dicts and lists as tuples;
    a tensor by identity, as torch compares them)."""
    if isinstance(value, dict):
        return ("dict",) + tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_hashable(v) for v in value)
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), value._version)
    return value


_DEFAULTS = core.ShampooConfig()

#: Settings fixed at a parameter's first step: its blocks (the per-dimension policy,
#: ``block_size``, ``stacked``) and how their factors and roots are stored.
_PLAN_FIELDS = tuple(k for k in PER_PARAMETER if k not in ("lr", "weight_decay")) + (
    "block_size", "stacked", "symmetric_packing", "root_storage_dtype")


def _plan_settings(config: core.ShampooConfig) -> tuple:
    return tuple(getattr(config, name) for name in _PLAN_FIELDS)


class Shampoo(ReplayedSteps, StepPreparation, ShampooStateDict, torch.optim.Optimizer):
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
    lr : float or tensor, optional
        The learning rate, by position or keyword as torch's optimizers take it
        (unset: :class:`~matroot.optim.ShampooConfig`'s default).
    distributed : "auto", None or ProcessGroup
        ``"auto"``: when ``torch.distributed`` is initialised with more than one
        rank, split the blocks over its ranks (see :mod:`matroot.optim.distributed.core`
        and docs/distributed.rst); None: never. Parameters may be ``DTensor`` s
        (FSDP2's ``fully_shard``): blocks are cut from whole parameters
        (:mod:`matroot.optim.distributed.dtensor`), so results do not depend on the sharding;
        DCP checkpoints: :mod:`matroot.optim.distributed.checkpoint`.
    graft_only : callable, optional
        ``graft_only(param) -> bool``: True keeps that parameter on the grafting
        update with no factors (per parameter; per group, set ``precondition=False``).
    graph_replay : "auto", True or False
        Capture each kind of step (between root refreshes; a refresh whose solves
        read nothing on the host) as a CUDA graph once per signature and replay it
        ("auto": on unsharded CUDA parameters; eager elsewhere, for a kind of step
        that read the host, and after a failed capture;
        :mod:`matroot.optim.torch.graph_replay`).
    **hyperparameters
        Any :class:`matroot.optim.ShampooConfig` field (``lr``, ``betas``,
        ``weight_decay``, ``block_size``, ...), its defaults and validation.

    Notes
    -----
    With ``nonfinite_grads="skip"`` a step reads nothing on the host: NaN/Inf
    gradients are found on the device and the step is skipped there. With
    ``"raise"`` (the default) and under ``torch.distributed``, one host read per
    step checks them first. A root refresh reads nothing more with the default
    fixed-step solves (their verdicts stay on the device); an adaptive solve with
    the host verdict reads its convergence checks. ``torch.compile(opt.step)``
    works; the root refresh runs outside its graph (docs/optimizer.rst, "Compiling
    the optimizer step").
    Moments and factors of bfloat16/float16 parameters are float32 and stay
    float32 through ``state_dict()``/``load_state_dict()``, which loads each
    tensor in the dtype this optimizer's parameters call for.

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

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
                 lr: Any = None, *, distributed: str | dist.ProcessGroup | None = "auto",
                 graft_only: Callable[[torch.Tensor], bool] | None = None,
                 graph_replay: str | bool = "auto",
                 **hyperparameters: Any) -> None:
        if lr is not None:
            hyperparameters["lr"] = lr
        check_keywords(hyperparameters)
        config = core.ShampooConfig(**{k: host_number(v) for k, v in hyperparameters.items()})
        defaults = {name: getattr(config, name) for name in _CONFIG_FIELDS}
        # A tensor stays one in the groups, as torch's optimizers keep it.
        defaults.update({k: v for k, v in hyperparameters.items() if torch.is_tensor(v)})
        # Plain values in the groups: state dicts hold them, and DCP loads with
        # weights_only=True, which unpickles no matroot class.
        defaults["root_options"] = config.root_options.keywords()
        self._families: list[_Family] = []
        self._process_group = resolve_process_group(distributed)
        self._graft_only = graft_only
        self._graph_replay = graph_replay
        StepGraphs(graph_replay)        # validated now
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        """Add a group (validated now; its parameters get their own stacks at the next step)."""
        # A misspelled option raises; the script's own keys ("name", ...) pass.
        check_keywords([k for k in param_group if k != "params"], metadata=True)
        param_group["params"] = listed_once(param_group["params"], "Shampoo")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if not p.is_floating_point():
                raise TypeError(f"Shampoo optimizes floating parameters, got dtype {p.dtype}")
        self._group_config(group)

    def _group_configs(self, group) -> tuple[core.ShampooConfig, core.ShampooConfig]:
        """The group's validated config and its :meth:`_shared` part, built when the
        group is added and again only after its values change (a scheduler's lr), not
        at every step. One entry per group: changing values replace it."""
        values = tuple(group[name] for name in _CONFIG_FIELDS)
        key = _hashable(values)
        cache = self.__dict__.setdefault("_configs", {})
        entry = cache.get(id(group))
        if entry is None or entry[0] != key:
            config = core.ShampooConfig(**{name: host_number(value)
                                           for name, value in zip(_CONFIG_FIELDS, values)})
            entry = cache[id(group)] = (key, config, self._shared(config))
        return entry[1], entry[2]

    def _group_config(self, group) -> core.ShampooConfig:
        return self._group_configs(group)[0]

    @staticmethod
    def _shared(config: core.ShampooConfig) -> core.ShampooConfig:
        """The part of a config that parameters sharing factor stacks must agree on."""
        return dataclasses.replace(config, **{f: getattr(_DEFAULTS, f) for f in PER_PARAMETER})

    def _all_params(self):
        return list(chain.from_iterable(g["params"] for g in self.param_groups))

    def _group_of(self):
        """Each parameter's group, by id. Raises ValueError where a parameter that has
        factor stacks has left every group (a family's stacks cannot drop a member)."""
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        # (Unpickling asks before any family is back.)
        for p in chain.from_iterable(f.params for f in self.__dict__.get("_families", ())):
            if id(p) not in group_of:
                raise ValueError(
                    f"a parameter of shape {tuple(p.shape)} left the parameter groups after "
                    "Shampoo gave it factor stacks, which it shares with other parameters "
                    "and cannot drop: keep it in its group (a parameter without a .grad is "
                    "not updated) or make a new optimizer for the changed model")
        return group_of

    def _family_config(self, family, group_of) -> core.ShampooConfig:
        groups = {id(group_of[id(p)]): group_of[id(p)] for p in family.params}
        configs = [self._group_configs(g) for g in groups.values()]
        shared = configs[0][1]
        for config, config_shared in configs[1:]:
            if config_shared != shared:
                raise ValueError(
                    "parameter groups that share Shampoo factor stacks must keep equal "
                    f"hyperparameters other than {', '.join(PER_PARAMETER)}; changed after "
                    f"the first step: {shared} vs {config}")
        planned_of = {key: _plan_settings(config) for key, (config, _) in zip(groups, configs)}
        for p, planned in zip(family.params, family.planned_settings):
            now = planned_of[id(group_of[id(p)])]
            if now != planned:
                changed = [k for k, a, b in zip(_PLAN_FIELDS, now, planned) if a != b]
                raise ValueError(
                    f"{', '.join(changed)} changed in the group of a parameter of shape "
                    f"{tuple(p.shape)} after its first step, which fixed its blocks and how "
                    "their factors are stored: set it before training, or make a new "
                    "optimizer")
        return configs[0][0]

    def _policy(self, p, group):
        policy = self._group_config(group).factor_policy
        if self._graft_only is not None and self._graft_only(p):
            policy = dataclasses.replace(policy, precondition=False)
        return policy

    def _form_families(self):
        """Give every trainable parameter without a family one, grouping by shared settings.

        Frozen parameters (``requires_grad=False``) without a ``.grad`` get none (one
        with a ``.grad`` is updated, as torch's optimizers update it); their state arrays, like
        everyone's, are only made by the first step with a gradient (a lazy core state).
        """
        owned = {id(p) for f in self._families for p in f.params}
        pending: list[tuple[core.ShampooConfig, torch.device, list, list]] = []
        for group in self.param_groups:
            shared = self._group_configs(group)[1]
            for p in group["params"]:
                if id(p) in owned or (not p.requires_grad and p.grad is None):
                    continue
                for config, device, members, policies in pending:
                    if config == shared and device == p.device:
                        members.append(p)
                        policies.append(self._policy(p, group))
                        break
                else:
                    pending.append((shared, p.device, [p], [self._policy(p, group)]))
        if pending and self._process_group is not None:
            agree_on_parameters([p for _, _, members, _ in pending for p in members],
                                self._process_group, is_dtensor)
        group_of = self._group_of() if pending else {}
        for config, _, members, policies in pending:
            plan = core.make_plan([p.detach() for p in members], config, policies=policies)
            family = self._new_family(members, config, plan)
            family.planned_settings = self._planned_settings(members, group_of)
            self._families.append(family)

    def _planned_settings(self, params, group_of) -> list:
        """Per parameter, its group's values of :data:`_PLAN_FIELDS`."""
        return [_plan_settings(self._group_config(group_of[id(p)])) for p in params]

    def _new_family(self, members, config, plan) -> _Family:
        detached = [p.detach() for p in members]
        if self._process_group is None:
            return _Family(members, core.init(detached, config, plan=plan, lazy=True))
        sharding = BlockSharding(plan, self._process_group, update_dtypes(members))
        # A lazy init reads the arrays' library, device and count only: no piece of a
        # DTensor is cut here (that would be a collective of its owners alone).
        placeholders = [local_view(detached[piece.param]) for piece in sharding.pieces]
        return _Family(members, core.init(placeholders, config, plan=sharding.local,
                                          lazy=True), sharding)

    @torch.no_grad()
    def step(self, closure=None):
        """Take one optimization step; ``closure`` re-evaluates the model and returns the loss."""
        loss = closure_loss(closure)
        with step_context(self.param_groups):
            jobs, grads, screen = self._prepare_step()
            if jobs is None:
                return loss
            refresh = any(job is not None and job.schedule[0] for job in jobs)
            if torch.compiler.is_compiling():
                (self._update_outside_graph if refresh else self._update)(jobs, grads, screen)
            elif not self._replays(jobs, grads, screen):
                self._update(jobs, grads, screen)
        return loss

    def _update(self, jobs, grads, screen) -> None:
        """The device side of a step: every family's core update, applied to the parameters.

        ``grads`` are whole gradients
        (:func:`~matroot.optim.distributed.dtensor.whole`), per family; ``screen`` says
        how non-finite gradients are found (:meth:`_prepare_step`).
        """
        finite = None
        if screen == _ON_DEVICE:
            finite = lists.finite_flag(torch, list(chain.from_iterable(grads)))
        targets, updates_all = [], []
        for family, fam_grads, job in zip(self._families, grads, jobs):
            if job is None:
                continue
            if screen == _SKIPPED:
                finite = torch.zeros((), dtype=torch.bool, device=family.params[0].device)
            self._sync_family_state(family)
            # A DTensor parameter is gathered only where weight decay reads it.
            params = [whole(p.detach()) if decay or not is_dtensor(p) else None
                      for p, decay in zip(family.params, job.decays)]
            sharding = family.sharding
            if sharding is not None:
                present = [g is not None for g in fam_grads]
                fam_grads, params = sharding.local_parts(fam_grads), \
                    sharding.local_parts(params)
                lrs, decays = ([values[piece.param] for piece in sharding.pieces]
                               for values in (job.lrs, job.decays))
            else:
                lrs, decays = job.lrs, job.decays
            if any(g is not None for g in fam_grads):  # none where a rank owns none
                updates, family.state = core.update(
                    fam_grads, family.state, params, job.config,
                    lr=lrs, weight_decay=decays, check_grads=False, in_place=True,
                    schedule=job.schedule, finite=finite)
                self._publish_family_state(family)
            else:
                updates = []
            if sharding is not None:
                updates, _ = sharding.share_updates(updates, present, family.params[0].device)
            for p, u in zip(family.params, updates):
                if u is not None:
                    targets.append(p)
                    updates_all.append(u)
        add_all_to_local(targets, updates_all)

    # A step with a root refresh runs eagerly under torch.compile: a solver's convergence
    # checks may read the host, and a graph break inside the families' loop would leave
    # the whole loop uncompiled. Steps without one stay in one graph.
    _update_outside_graph = torch.compiler.disable(_update)

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
