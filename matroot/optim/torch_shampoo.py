"""``matroot.optim.Shampoo``: a ``torch.optim.Optimizer`` around the functional core.

The shell maps torch's parameter groups onto the core: parameters whose groups
agree on every hyperparameter except ``lr`` and ``weight_decay`` share one set
of factor stacks (a *family*), so the whole model's equal-size factors are
solved by one ``inv_root`` call per size; ``lr`` and ``weight_decay`` are read
per group at every step, so LR schedulers work. A group added after training
started gets a family of its own (its own step count and stacks).

Per-parameter state (``step``, ``exp_avg``, ``exp_avg_sq``) lives in
``optimizer.state[p]`` as in torch's own optimizers; the factor and root
stacks live with their family and travel in ``state_dict()["shampoo_families"]``.
"""

from __future__ import annotations

import dataclasses
from itertools import chain

import torch

from . import core
from .distributed import BlockSharding, agree_on_gradients, check_shard, resolve_process_group

__all__ = ["Shampoo"]

_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(core.ShampooConfig))
#: Hyperparameters that may differ between groups sharing a family.
_PER_GROUP = ("lr", "weight_decay")


class _Family:
    """Parameters that share factor stacks, their core state and, when sharded, their split."""

    def __init__(self, params, state: core.ShampooState, sharding=None):
        self.params = params
        self.state = state
        self.sharding = sharding


class Shampoo(torch.optim.Optimizer):
    """Stacked-block Shampoo with Adam grafting, as a ``torch.optim.Optimizer``.

    Weights are cut into blocks of at most ``block_size``; the Kronecker factors
    of all blocks of the model are kept in one ``(b, n, n)`` stack per size and
    their inverse roots computed by one :func:`matroot.inv_root` call per stack.
    Each block's Shampoo direction is rescaled to the norm of its Adam direction;
    before ``start_preconditioning_step``, and for vectors and scalars (unless
    ``precondition_1d``), the update is AdamW's. See
    :class:`matroot.optim.ShampooConfig` for every hyperparameter.

    Parameters
    ----------
    params : iterable of tensors or dicts
        Parameters or parameter groups; any hyperparameter may be set per group.
    lr : float
        Learning rate.
    betas : (float, float)
        ``β₁`` for momentum; ``β₂`` for the factors and the Adam second moment.
    eps : float
        Adam epsilon (added to ``√v̂``).
    weight_decay : float
        Decoupled weight decay (AdamW's).
    nesterov, bias_correction, grafting_beta2, block_size, precondition_frequency,
    start_preconditioning_step, root_method, matrix_eps, root_options,
    precondition_1d, stacked, nonfinite_grads
        As in :class:`matroot.optim.ShampooConfig`.
    distributed : "auto", None or ProcessGroup
        ``"auto"``: when ``torch.distributed`` is initialised with more than one
        rank, split the blocks over its ranks (see :mod:`matroot.optim.distributed`
        and docs/distributed.rst); None: never.

    Notes
    -----
    ``step()`` makes one host sync to check the gradients for NaN/Inf (and one per
    root refresh for the solver's convergence checks). Moments and factors of
    bfloat16/float16 parameters are float32 and stay float32 through
    ``state_dict()``/``load_state_dict()``.

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

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 nesterov=False, bias_correction=True, grafting_beta2=None, block_size=1024,
                 precondition_frequency=10, start_preconditioning_step=None, root_method="auto",
                 matrix_eps=1e-8, root_options=None, precondition_1d=False, stacked=True,
                 nonfinite_grads="raise", distributed="auto"):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        nesterov=nesterov, bias_correction=bias_correction,
                        grafting_beta2=grafting_beta2, block_size=block_size,
                        precondition_frequency=precondition_frequency,
                        start_preconditioning_step=start_preconditioning_step,
                        root_method=root_method, matrix_eps=matrix_eps,
                        root_options=dict(root_options or {}), precondition_1d=precondition_1d,
                        stacked=stacked, nonfinite_grads=nonfinite_grads)
        core.ShampooConfig(**defaults)
        self._families: list[_Family] = []
        self._process_group = resolve_process_group(distributed)
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

    def _all_params(self):
        return list(chain.from_iterable(g["params"] for g in self.param_groups))

    def _group_of(self):
        return {id(p): g for g in self.param_groups for p in g["params"]}

    def _family_config(self, family, group_of) -> core.ShampooConfig:
        groups = {id(group_of[id(p)]): group_of[id(p)] for p in family.params}
        configs = [self._group_config(g) for g in groups.values()]
        shared = dataclasses.replace(configs[0], lr=0.0, weight_decay=0.0)
        for config in configs[1:]:
            if dataclasses.replace(config, lr=0.0, weight_decay=0.0) != shared:
                raise ValueError(
                    "parameter groups that share Shampoo factor stacks must keep equal "
                    "hyperparameters other than lr and weight_decay; changed after the "
                    f"first step: {shared} vs {config}")
        return configs[0]

    def _form_families(self):
        """Give every parameter not yet in a family one, grouping by shared settings."""
        owned = {id(p) for f in self._families for p in f.params}
        pending: list[tuple[core.ShampooConfig, torch.device, list]] = []
        for group in self.param_groups:
            shared = dataclasses.replace(self._group_config(group), lr=0.0, weight_decay=0.0)
            for p in group["params"]:
                if id(p) in owned:
                    continue
                for config, device, members in pending:
                    if config == shared and device == p.device:
                        members.append(p)
                        break
                else:
                    pending.append((shared, p.device, [p]))
        for config, _, members in pending:
            self._families.append(self._new_family(members, config))
            state = self._families[-1].state
            for p, m, v in zip(members, state.exp_avg, state.exp_avg_sq):
                self.state[p] = {"step": 0, "exp_avg": m, "exp_avg_sq": v}

    def _new_family(self, members, config) -> _Family:
        detached = [p.detach() for p in members]
        if self._process_group is None:
            return _Family(members, core.init(detached, config))
        sharding = BlockSharding(core.make_plan(detached, config), self._process_group)
        return _Family(members, core.init(detached, config, plan=sharding.local), sharding)

    def _sync_family_state(self, family):
        """The family's core state with the per-parameter entries of ``self.state``."""
        per_param = [self.state[p] for p in family.params]
        family.state = family.state._replace(
            param_steps=tuple(int(s["step"]) for s in per_param),
            exp_avg=[s["exp_avg"] for s in per_param],
            exp_avg_sq=[s["exp_avg_sq"] for s in per_param])

    @torch.no_grad()
    def step(self, closure=None):
        """Take one optimization step; ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._form_families()
        group_of = self._group_of()
        grads = []
        for family in self._families:
            fam_grads = []
            for p in family.params:
                if p.grad is not None and p.grad.is_sparse:
                    raise TypeError("Shampoo does not support sparse gradients")
                fam_grads.append(None if p.grad is None else p.grad.detach())
            grads.append(fam_grads)
        bad = self._nonfinite_params(grads)
        if bad:
            params = self._all_params()
            if any(group_of[id(params[i])]["nonfinite_grads"] == "raise" for i in bad):
                raise core.NonFiniteGradientError(
                    f"gradients of parameters {bad} (state_dict numbering) contain NaN or Inf; "
                    "pass nonfinite_grads='skip' to skip such steps instead")
            for family in self._families:
                family.state = family.state._replace(
                    skipped_steps=family.state.skipped_steps + 1)
            return loss

        for family, fam_grads in zip(self._families, grads):
            if all(g is None for g in fam_grads):
                continue
            config = self._family_config(family, group_of)
            groups = [group_of[id(p)] for p in family.params]
            self._sync_family_state(family)
            updates, family.state = core.update(
                fam_grads, family.state, [p.detach() for p in family.params], config,
                lr=[g["lr"] for g in groups], weight_decay=[g["weight_decay"] for g in groups],
                check_grads=False, in_place=True)
            if family.sharding is not None and \
                    family.state.step >= config.first_preconditioned_step:
                family.sharding.share_updates(updates)
            for p, u, t in zip(family.params, updates, family.state.param_steps):
                self.state[p]["step"] = t
                if u is None:
                    continue
                if u.dtype == p.dtype:
                    p.add_(u)
                else:
                    p.copy_(p.to(u.dtype) + u)
        return loss

    def _nonfinite_params(self, grads) -> list:
        """state_dict numbers of parameters with NaN/Inf gradients (on any rank when sharded)."""
        members = [p for f in self._families for p in f.params]
        flat = list(chain.from_iterable(grads))
        if self._process_group is not None:
            flags = agree_on_gradients(flat, self._process_group, members[0].device)
        else:
            present = [g for g in flat if g is not None]
            if not present or bool(torch.stack([torch.isfinite(g).all() for g in present]).all()):
                return []
            flags = [g is not None and not bool(torch.isfinite(g).all()) for g in flat]
        index = {id(p): i for i, p in enumerate(self._all_params())}
        return sorted(index[id(p)] for p, bad in zip(members, flags) if bad)

    def diagnostics(self) -> dict:
        """Counters and memory of the optimizer state, summed over families.

        Returns
        -------
        dict
            ``steps`` (of the first family), ``root_refreshes``, ``root_failures``
            (rejected roots, all refreshes), ``skipped_steps``, ``stacks``,
            ``blocks``, ``state_bytes`` and ``state_bytes_per_parameter``.
        """
        out: dict[str, float] = {
            "steps": 0, "root_refreshes": 0, "root_failures": 0, "skipped_steps": 0,
            "stacks": 0, "blocks": 0, "state_bytes": 0, "parameters": 0}
        for i, family in enumerate(self._families):
            self._sync_family_state(family)
            st = family.state
            if i == 0:
                out["steps"] = st.step
            out["root_refreshes"] += st.root_refreshes
            out["root_failures"] += sum(int(f.sum()) for f in st.root_failures)
            out["skipped_steps"] += st.skipped_steps
            out["stacks"] += len(st.plan.stacks)
            out["blocks"] += st.plan.num_blocks
            out["state_bytes"] += core.state_bytes(st)["total"]
            out["parameters"] += sum(p.numel() for p in family.params)
        out["state_bytes_per_parameter"] = (out["state_bytes"] / out["parameters"]
                                            if out["parameters"] else 0.0)
        return out

    def state_dict(self):
        """torch's state dict plus ``"shampoo_families"``: each family's stacks and counters."""
        sd = super().state_dict()
        index = {id(p): i for i, p in enumerate(self._all_params())}
        sd["shampoo_families"] = [
            {"params": [index[id(p)] for p in f.params], "step": f.state.step,
             "root_refreshes": f.state.root_refreshes, "skipped_steps": f.state.skipped_steps,
             "factors": list(f.state.factors), "roots": list(f.state.roots),
             "root_failures": list(f.state.root_failures)}
            for f in self._families]
        for record, f in zip(sd["shampoo_families"], self._families):
            if f.sharding is not None:
                record["shard"] = f.sharding.record()
        return sd

    def load_state_dict(self, state_dict):
        """Restore a state dict exactly, keeping float32 state of 16-bit parameters float32.

        torch's loader casts floating state to each parameter's dtype; the saved
        tensors are put back with their own dtype afterwards, so continuing after
        a reload is bit-identical to continuing without one.
        """
        state_dict = dict(state_dict)
        families = state_dict.pop("shampoo_families", [])
        saved = state_dict.get("state", {})
        super().load_state_dict(state_dict)
        params = self._all_params()
        for index, entries in saved.items():
            p = params[int(index)]
            self.state[p] = {k: (v.detach().to(device=p.device, copy=True)
                                 if torch.is_tensor(v) else v) for k, v in entries.items()}
        group_of = self._group_of()
        self._families = []
        for record in families:
            members = [params[i] for i in record["params"]]
            config = self._group_config(group_of[id(members[0])])
            plan = core.make_plan([p.detach() for p in members], config)
            sharding = None if self._process_group is None else \
                BlockSharding(plan, self._process_group)
            check_shard(record.get("shard"), sharding)
            plan = plan if sharding is None else sharding.local
            device = members[0].device
            expected = [(s.count, s.size, s.size) for s in plan.stacks]

            def restore(name, shapes, record=record, device=device):
                arrays = record[name]
                if [tuple(a.shape) for a in arrays] != shapes:
                    raise ValueError(
                        f"state dict {name} stacks {[tuple(a.shape) for a in arrays]} do not "
                        f"fit the parameters' block plan {shapes}")
                return [a.detach().to(device=device, copy=True) for a in arrays]

            state = core.ShampooState(
                step=int(record["step"]), param_steps=(0,) * len(members), exp_avg=[],
                exp_avg_sq=[], factors=restore("factors", expected),
                roots=restore("roots", expected),
                root_failures=restore("root_failures", [(s.count,) for s in plan.stacks]),
                root_refreshes=int(record["root_refreshes"]),
                skipped_steps=int(record["skipped_steps"]), plan=plan)
            family = _Family(members, state, sharding)
            self._sync_family_state(family)
            self._families.append(family)
