"""``matroot.optim.SOAP``: a ``torch.optim.Optimizer`` around the SOAP functional core.

As in :class:`matroot.optim.Shampoo`, parameters whose groups agree on every
hyperparameter except ``lr`` and ``weight_decay`` (read per group at every step, so
LR schedulers work) share one set of factor and basis stacks (a *family*), so each
size's eigenbases in the whole model are refreshed by one
:func:`matroot.refresh_eigenbasis` call. A parameter gets its family at its first
step with a gradient. The settings that fix a parameter's blocks (``block_size``,
``max_preconditioned_dim``, ``max_factor_ratio``, ``precondition_1d``, ``stacked``)
may not change after that; the others (betas, eps, the refresh schedule and
options) may.

The state (moments, factors, bases, counters) lives with the families and travels
in ``state_dict()["soap_families"]``, each with the numbers of its parameters in
the ``param_groups`` order; ``load_state_dict`` rebuilds the families on this
optimizer's parameters. Counters are Python ints (a step hands the core its
per-parameter counts as 0-d tensors when compiled,
:func:`~matroot.optim.torch.soap_counts.steps_as_tensors`): a step reads the host
once (the non-finite check), and a refresh step as the eigenbasis certificate does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist

from ... import _xp
from ..distributed.core import resolve_process_group
from ..distributed.dtensor import add_all_to_local, is_dtensor, local_view, whole
from ..distributed.soap_checkpoint import cut_family
from ..soap import core
from ..soap.config import FIELDS, PER_PARAMETER, SOAPConfig, check_soap_keywords
from ..soap.state import GRAFTING_FIELDS, SOAPState, init, make_plan
from .closure import closure_loss
from .soap_counts import counted_steps, steps_as_tensors
from .param_lists import listed_once
from .soap_sharding import SoapSharding
from .state import host_number
from .step_context import refuse_valueless, step_context

__all__ = ["SOAP"]

_DEFAULTS = SOAPConfig()
#: Settings fixed at a parameter's first step: they decide its blocks.
_PLAN_FIELDS = ("block_size", "max_preconditioned_dim", "max_factor_ratio", "precondition_1d",
                "stacked")
_ARRAYS = ("exp_avg", "exp_avg_sq", "block_exp_avg", "block_exp_avg_sq", "factors", "bases",
           "residuals") + GRAFTING_FIELDS
_COUNTERS = ("step", "refreshes", "skipped_steps")


def _config_of(group) -> SOAPConfig:
    """The group's config; tensor values (``lr=torch.tensor(...)``, as torch's optimizers
    take it) as the numbers they hold."""
    values = {name: host_number(group[name]) for name in FIELDS}
    values["betas"] = tuple(values["betas"])
    return SOAPConfig(**values)


def _shared(config: SOAPConfig) -> SOAPConfig:
    """The part of a config that parameters sharing stacks agree on."""
    return dataclasses.replace(config, **{f: getattr(_DEFAULTS, f) for f in PER_PARAMETER})


def _decayed_params(params, decays) -> list:
    """The parameters for the core's weight decay: a DTensor gathered whole only where
    its decay is not 0 (None otherwise; the core reads no parameter without decay)."""
    return [whole(p.detach()) if decay and is_dtensor(p) else
            None if is_dtensor(p) else p for p, decay in zip(params, decays)]


class _Family:
    """Parameters that share stacks, their core state, the config they were planned
    with and, when sharded, their split over the ranks."""

    def __init__(self, params, config: SOAPConfig, state: SOAPState,
                 sharding: SoapSharding | None = None):
        self.params, self.config, self.state, self.sharding = params, config, state, sharding
        #: 0-d tensors the step counts are handed to the core in
        #: (:func:`~matroot.optim.torch.soap_counts.steps_as_tensors`).
        self.step_slots: list = []


def _new_family(params, config: SOAPConfig, group) -> _Family:
    if group is None:
        return _Family(params, config, init(params, config))
    sharding = SoapSharding(group, make_plan(params, config))
    return _Family(params, config, init(params, config, plan=sharding.local,
                                        elementwise=sharding.elementwise), sharding)


class SOAP(torch.optim.Optimizer):
    """Stacked SOAP (Adam in the eigenbasis of Shampoo's factors) as a ``torch.optim.Optimizer``.

    Parameters
    ----------
    params : iterable of tensors or dicts
        Parameters or parameter groups; any hyperparameter may be set per group.
    lr : float, optional
        The learning rate, by position or keyword as torch's optimizers take it
        (unset: :class:`~matroot.optim.soap.config.SOAPConfig`'s default).
    distributed : "auto", None or ProcessGroup
        ``"auto"``: when ``torch.distributed`` is initialised with more than one rank,
        each rank keeps the state of its share of the blocks and the ranks sum their
        directions (:mod:`matroot.optim.torch.soap_sharding`; every rank must see the
        same gradients, as after DDP's all-reduce); None: never.
    **hyperparameters
        Any :class:`matroot.optim.soap.SOAPConfig` field (``lr``, ``betas``,
        ``shampoo_beta``, ``eps``, ``weight_decay``, ``precondition_frequency``,
        ``block_size``, ``max_preconditioned_dim``, ``maximize``, ``grafting``, ...),
        its defaults and validation. A grafting with moments ("adam", "rmsprop",
        "adagrad") keeps them in the state dict, sharded as SOAP's own.

    Examples
    --------
    >>> import torch
    >>> from matroot.optim import SOAP
    >>> model = torch.nn.Linear(8, 4)
    >>> opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=5)
    >>> x, y = torch.randn(32, 8), torch.randn(32, 4)
    >>> for _ in range(10):
    ...     opt.zero_grad()
    ...     torch.nn.functional.mse_loss(model(x), y).backward()
    ...     opt.step()
    >>> opt.diagnostics()["refreshes"]
    2
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
                 lr: float | None = None, *,
                 distributed: str | dist.ProcessGroup | None = "auto",
                 **hyperparameters: Any) -> None:
        if lr is not None:
            hyperparameters["lr"] = lr
        check_soap_keywords(hyperparameters)
        config = SOAPConfig(**{k: host_number(v) for k, v in hyperparameters.items()})
        self._families: list[_Family] = []
        self._process_group = resolve_process_group(distributed)
        defaults = {name: getattr(config, name) for name in FIELDS}
        # A tensor stays one in the groups, as torch's optimizers keep it (a scheduler
        # then fills it in place).
        defaults.update({k: v for k, v in hyperparameters.items() if torch.is_tensor(v)})
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (validated now; its parameters get stacks at their first step)."""
        # A group may carry the script's own keys ("name", ...), as torch allows.
        check_soap_keywords([k for k in param_group if k != "params"], metadata=True)
        param_group["params"] = listed_once(param_group["params"], "SOAP")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if not p.is_floating_point():
                raise TypeError(f"SOAP optimizes floating parameters, got dtype {p.dtype}")
        _config_of(group)

    def _shared_of(self, group) -> SOAPConfig:
        """The group's shared config, made again only when one of its values changes (a
        scheduler's lr), not at every step for every parameter."""
        values = tuple(tuple(host_number(group[name])) if name == "betas" else
                       host_number(group[name]) for name in FIELDS)
        cache = self.__dict__.setdefault("_shared_configs", {})
        entry = cache.get(id(group))
        if entry is None or entry[0] != values:
            entry = cache[id(group)] = (values, _shared(_config_of(group)))
        return entry[1]

    def _all_params(self) -> list:
        return list(chain.from_iterable(g["params"] for g in self.param_groups))

    def _group_of(self) -> dict:
        return {id(p): g for g in self.param_groups for p in g["params"]}

    def _form_families(self, group_of) -> None:
        owned = {id(p) for f in self._families for p in f.params}
        pending: dict = {}
        for p in self._all_params():
            if id(p) in owned or p.grad is None:
                continue
            if p.grad.is_sparse:
                raise TypeError("SOAP does not support sparse gradients (an Embedding made "
                                "with sparse=True): make it dense")
            shared = self._shared_of(group_of[id(p)])
            pending.setdefault((shared, p.device), []).append(p)
        for (shared, _), params in pending.items():
            self._families.append(_new_family(params, shared, self._process_group))

    def _family_config(self, family: _Family, group_of) -> SOAPConfig:
        groups = {id(group_of[id(p)]): group_of[id(p)] for p in family.params}
        configs = {self._shared_of(g) for g in groups.values()}
        if len(configs) > 1:
            raise ValueError("parameter groups that share SOAP stacks must keep equal "
                             "hyperparameters other than lr and weight_decay")
        config = configs.pop()
        changed = [k for k in _PLAN_FIELDS if getattr(config, k) != getattr(family.config, k)]
        if config.keeps_grafting_moments != family.config.keeps_grafting_moments:
            changed.append("grafting (to or from one with moments)")
        if changed:
            raise ValueError(f"{', '.join(changed)} changed after the first step, which fixed "
                             "the parameters' blocks and state: set it before training, or "
                             "make a new optimizer")
        return config

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One step; ``closure`` re-evaluates the model and returns the loss."""
        loss = closure_loss(closure)
        refuse_valueless(self.param_groups, "SOAP")
        with step_context(self.param_groups):
            self._step_families()
        return loss

    def _step_families(self) -> None:
        group_of = self._group_of()
        self._form_families(group_of)
        for family in self._families:
            grads = [p.grad for p in family.params]
            if all(g is None for g in grads):
                continue
            config = self._family_config(family, group_of)
            groups = [group_of[id(p)] for p in family.params]
            lrs = [float(g["lr"]) for g in groups]
            decays = [float(g["weight_decay"]) for g in groups]
            # DTensor (FSDP2) gradients are gathered whole, on every rank in one order.
            grads = [whole(g) for g in grads]
            if family.sharding is not None:
                self._sharded_step(family, config, grads, lrs, decays)
                continue
            # Eager steps keep Python int counts (no fill or tensor bias corrections:
            # fewer launches); a compiled step needs them as tensors.
            counted = (steps_as_tensors(family, grads) if _xp.within_torch_compile()
                       else family.state)
            updates, state = core.update(grads, counted,
                                         _decayed_params(family.params, decays), config,
                                         lr=lrs, weight_decay=decays, in_place=True)
            family.state = counted_steps(family.state, state, grads)
            pairs = [(p, u) for p, u in zip(family.params, updates) if u is not None]
            # Plain parameters in one foreach addition; a DTensor takes its own rows.
            add_all_to_local([p for p, _ in pairs],
                             [u if u.dtype == p.dtype else u.to(p.dtype) for p, u in pairs])

    def _sharded_step(self, family: _Family, config: SOAPConfig, grads, lrs, decays) -> None:
        """A step of a sharded family: every rank screens every gradient (so all decide
        alike), runs the core on its share and adds the ranks' summed directions."""
        sharding, params = family.sharding, family.params
        assert sharding is not None
        xp = _xp.array_namespace(*[g for g in grads if g is not None])
        skipped = core.screen(xp, grads, family.state, config)
        if skipped is not None:
            family.state = skipped[1]
            return
        local = sharding.local_grads(grads)
        decoupled = config.weight_decay_type == "decoupled"
        decays_here = [0.0] * len(params) if decoupled else decays
        # Gathered on every rank, owner or not: a DTensor's gather is a collective.
        decayed_params = _decayed_params(params, decays_here)
        if any(g is not None for g in local):
            updates, family.state = core.update(
                local, family.state, decayed_params, config, lr=lrs,
                weight_decay=decays_here, check_grads=False, in_place=True)
        else:       # this rank owns nothing of the family: its counters still advance
            updates = [None] * len(params)
            family.state = family.state._replace(step=family.state.step + 1)
        summed = sharding.summed(params, updates)
        present = [i for i, u in enumerate(summed) if u is not None]
        decayed = [i for i in present if decoupled and lrs[i] * decays[i]]
        if decayed:      # on this rank's rows of a DTensor parameter
            torch._foreach_mul_([local_view(params[i].detach()) for i in decayed],
                                [1.0 - lrs[i] * decays[i] for i in decayed])
        add_all_to_local([params[i] for i in present],
                         [summed[i].to(params[i].dtype) for i in present])

    def diagnostics(self) -> dict:
        """Steps taken, refresh rounds and skipped steps (of the first family), and the
        largest eigenbasis residual at the last refresh over all families."""
        if not self._families:
            return {"steps": 0, "refreshes": 0, "skipped_steps": 0, "max_residual": 0.0}
        state = self._families[0].state
        residuals = [float(r.max()) for f in self._families for r in f.state.residuals
                     if r.numel()]
        return {"steps": int(state.step), "refreshes": int(state.refreshes),
                "skipped_steps": int(state.skipped_steps),
                "max_residual": max(residuals, default=0.0)}

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus ``"soap_families"``: per family its parameters'
        numbers, counters and arrays."""
        saved = super().state_dict()
        number = {id(p): i for i, p in enumerate(self._all_params())}
        families = []
        for f in self._families:
            state = f.state
            entry: dict[str, Any] = {"params": [number[id(p)] for p in f.params],
                                     "param_steps": [int(s) for s in state.param_steps]}
            entry.update({name: int(getattr(state, name)) for name in _COUNTERS})
            entry.update({name: list(getattr(state, name)) for name in _ARRAYS})
            entry["shard"] = None if f.sharding is None else [f.sharding.world, f.sharding.rank]
            families.append(entry)
        saved["soap_families"] = families
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``, then the families rebuilt on this optimizer's
        parameters (copies of the saved arrays, on each parameter's device)."""
        state_dict = dict(state_dict)
        saved = state_dict.pop("soap_families", [])
        super().load_state_dict(state_dict)
        for group in self.param_groups:     # options newer than the state dict: defaults
            for name in FIELDS:
                group.setdefault(name, getattr(_DEFAULTS, name))
        params = self._all_params()
        group_of = self._group_of()
        families = []
        for entry in saved:
            members = [params[i] for i in entry["params"]]
            config = self._shared_of(group_of[id(members[0])])
            family = _new_family(members, config, self._process_group)
            shard = None if family.sharding is None else \
                [family.sharding.world, family.sharding.rank]
            if entry.get("shard") is None and shard is not None:    # this rank's part
                entry = cut_family(entry, make_plan(members, config), *shard)
            if entry.get("shard") != shard:
                raise ValueError(f"the state dict's SOAP family was saved on world/rank "
                                 f"{entry.get('shard')}, this optimizer runs on {shard}: "
                                 "load it with the world size it was saved with, or merge "
                                 "every rank's (matroot.optim.distributed.soap_checkpoint)")
            fresh = family.state
            arrays: dict[str, Any] = {name: int(entry[name]) for name in _COUNTERS}
            for name in _ARRAYS:
                expected = getattr(fresh, name)
                # A state dict saved before grafting existed has none of its moments.
                values = entry.get(name, [None] * len(expected)) \
                    if name in GRAFTING_FIELDS else entry[name]
                if len(values) != len(expected) or any(
                        (a is None) != (b is None) or (b is not None and a.shape != b.shape)
                        for a, b in zip(values, expected)):
                    cause = (f"saved with another grafting than {config.grafting!r}"
                             if name in GRAFTING_FIELDS else "saved for another model")
                    raise ValueError(f"the state dict's SOAP {name!r} does not fit these "
                                     f"parameters: it was {cause}")
                arrays[name] = [None if a is None else
                                a.detach().to(device=b.device, dtype=b.dtype, copy=True)
                                for a, b in zip(values, expected)]
            family.state = fresh._replace(param_steps=tuple(entry["param_steps"]), **arrays)
            families.append(family)
        self._families = families

    def __getstate__(self) -> dict[str, Any]:
        """torch's pickled state (``pickle``, ``copy.deepcopy``, ``torch.save(opt)``) plus
        the families, which torch's leaves out (a copy then failed at its next step)."""
        if self._process_group is not None:
            raise TypeError("a sharded SOAP cannot be pickled or deep-copied (its process "
                            "group does not pickle); save its state_dict() and load it "
                            "into a new optimizer instead")
        return {**super().__getstate__(), "_soap_families": self._families}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        families = state.pop("_soap_families", None)
        super().__setstate__(state)
        if families is not None:        # unpickled (load_state_dict passes none)
            self._families, self._process_group = families, None

    def _saved_plans(self, state_dict: dict) -> list:
        """The whole block plan of each family of ``state_dict`` on this optimizer's
        parameters, with the settings it was saved with."""
        params = self._all_params()
        group_of = {i: g for g in state_dict["param_groups"] for i in g["params"]}
        return [make_plan([params[i] for i in entry["params"]],
                          _shared(_config_of(group_of[entry["params"][0]])))
                for entry in state_dict["soap_families"]]
