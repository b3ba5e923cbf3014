"""``matroot.optim.Muon``: a ``torch.optim.Optimizer`` around the stacked Muon core.

Parameter groups carry ``lr``, ``weight_decay``, ``use_muon``, ``momentum`` (μ, read
by Muon groups) and ``betas`` (read by AdamW groups), so schedulers that cycle
momentum (``OneCycleLR``, ``CyclicLR``) and per-group settings work; everything
else (:class:`~matroot.optim.muon.core.MuonConfig`) is optimizer-wide, since the Muon
matrices of all groups share one polar call per shape. Parameters given without
``use_muon`` are split by :func:`~matroot.optim.muon.core.default_use_muon`
(:mod:`matroot.optim.torch.muon_groups`; pass
``model.named_parameters()`` so embeddings and heads are recognised: unnamed
matrices sent to Muon draw a ``UserWarning``), with the
group keys of :class:`Muon`'s ``params``. Per-parameter state
(``momentum_buffer``, ``exp_avg_sq`` for AdamW, ``step`` a Python int) lives in
``optimizer.state[p]``, so ``state_dict()`` and LR schedulers work as for torch's
own optimizers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from ..muon.core import (MuonConfig, MuonState, check_muon_keywords, matrix_stack_shape,
                         muon_directions)
from ..distributed.core import resolve_process_group
from ..shampoo_core.gradients import apply_nonfinite_policy, nonfinite_params
from ..distributed.dtensor import is_dtensor
from ..distributed.muon_step import ShardedMuon
from .closure import closure_loss
from .muon_groups import consistent_names, split_groups
from .step_context import step_context
from .state import with_missing_group_keys

__all__ = ["Muon"]

class Muon(torch.optim.Optimizer):
    """Stacked Muon for torch: one batched polar factor per matrix shape of the model.

    Parameters
    ----------
    params : iterable
        Tensors, ``(name, tensor)`` pairs (``model.named_parameters()``: the rule
        then sends embeddings and heads to AdamW) or group dicts, which may set
        ``use_muon``, ``lr``, ``weight_decay``, ``momentum`` (Muon groups) and
        ``betas`` (AdamW groups) and ``split`` (Muon groups: cut every matrix
        into that many equal blocks of rows, orthogonalized separately: 3 for a
        fused QKV weight, ``3·heads`` per head;
        :func:`~matroot.optim.muon.core.matrix_stack_shape`). A group with
        ``use_muon`` (as MuonWithAuxAdam's
        groups) is one half and its ``lr`` and ``weight_decay`` are that half's
        (unset: the constructor's ``lr``/``weight_decay`` for a Muon group,
        ``adamw_lr``/``adamw_weight_decay`` for an AdamW one). A
        group without it is split by the rule and reads its keys as the constructor
        reads its keywords: ``lr`` and ``weight_decay`` for its Muon part,
        ``adamw_lr`` and ``adamw_weight_decay`` for its AdamW part (unset: the
        constructor's). Such a group that sets ``lr`` (``weight_decay``) without
        ``adamw_lr`` (``adamw_weight_decay``) while the rule sends some of its
        parameters to AdamW raises ``ValueError``: a script written for AdamW
        means the value for all of them, one for torch.optim.Muon (2-D only) for
        the matrices.
    lr, weight_decay : float
        Muon's step size and decoupled weight decay.
    adamw_lr, adamw_weight_decay : float
        The same for the AdamW parameters.
    distributed : "auto", None or ProcessGroup
        Split the work over the ranks of this process group (``"auto"``: the default
        group when ``torch.distributed`` runs more than one rank): each rank keeps
        the state of its part of the parameters and orthogonalizes the matrices it
        owns whole (:mod:`matroot.optim.distributed.muon_step`); DDP, FSDP2
        (``fully_shard``) and other DTensor parameters, mixed. None: one process.
    **config
        :class:`~matroot.optim.muon.core.MuonConfig` fields (momentum, nesterov,
        shape_scale, polar_method, polar_lower, polar_steps, matmul_dtype,
        betas, eps, nonfinite_grads); ``momentum`` and ``betas`` are the groups'
        defaults. A step with NaN/Inf gradients raises ``NonFiniteGradientError``
        (``nonfinite_grads="raise"``) or is skipped and counted in
        ``skipped_steps`` (``"skip"``).

    Examples
    --------
    >>> import torch
    >>> from matroot.optim import Muon
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> opt = Muon(model.named_parameters(), lr=0.02, adamw_lr=1e-3)
    >>> [g["use_muon"] for g in opt.param_groups]
    [True, False]
    >>> loss = model(torch.ones(3, 4)).square().sum()
    >>> loss.backward()
    >>> opt.step()
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.02, weight_decay: float = 0.0,
                 adamw_lr: float = 3e-4, adamw_weight_decay: float = 0.0,
                 distributed: Any = "auto", **config: Any):
        check_muon_keywords(config)
        self.config = MuonConfig(**config)
        self._process_group = resolve_process_group(distributed)
        self._sharded: ShardedMuon | None = None
        #: Steps skipped for NaN/Inf gradients (``nonfinite_grads="skip"``); not saved.
        self.skipped_steps = 0
        self._split_defaults = (lr, weight_decay, adamw_lr, adamw_weight_decay)
        groups = split_groups(params, *self._split_defaults)
        # "betas" is in every group but not in the defaults: a momentum-cycling
        # scheduler then cycles Muon's μ, as it does torch.optim.Muon's.
        super().__init__(groups, dict(lr=lr, weight_decay=weight_decay, use_muon=True,
                                      momentum=self.config.momentum))
        if self._process_group is None and any(
                is_dtensor(p) for g in self.param_groups for p in g["params"]):
            if distributed is None or distributed is False or not (
                    dist.is_available() and dist.is_initialized()):
                raise ValueError(
                    "Muon got DTensor parameters (FSDP2's fully_shard, distribute_tensor) "
                    "with distributed=None: pass distributed='auto' (the default) or the "
                    "process group of the ranks they are spread over")
            # A world of one: the sharded step still makes the DTensors whole.
            self._process_group = (distributed if isinstance(distributed, dist.ProcessGroup)
                                   else dist.group.WORLD)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; without ``use_muon`` it is split by the rule, as in the constructor."""
        for group in split_groups([param_group], *self._split_defaults):
            group.setdefault("betas", self.config.betas)
            super().add_param_group(consistent_names(group, self.param_groups))
            added = self.param_groups[-1]
            MuonConfig(momentum=added["momentum"], betas=tuple(added["betas"]))  # validates
            for p in added["params"]:
                if added["use_muon"]:   # a split that does not divide raises now
                    matrix_stack_shape(p.shape, int(added.get("split", 1)))
                if not p.is_floating_point():
                    raise TypeError(f"Muon optimizes real floating parameters, got dtype "
                                    f"{p.dtype}")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One step; ``closure`` re-evaluates the model and returns the loss."""
        loss = closure_loss(closure)
        with step_context(self.param_groups):
            if self._process_group is not None:
                self._sharded_step()
            else:
                self._local_step()
        return loss

    def _local_step(self) -> None:
        """The step of one process: its parameters' Muon and AdamW directions applied."""
        prepared = self._prepare_step()
        if prepared is None:
            return
        members, states, steps, use_muon, lrs, decays, momenta, betas, splits = prepared
        core_state = MuonState([s["momentum_buffer"] for s in states],
                               [s.get("exp_avg_sq") for s in states], steps)
        directions, new = muon_directions([p.grad for p in members], core_state, use_muon,
                                          self.config, momentum=momenta, betas=betas,
                                          split=splits)
        for state, steps_now in zip(states, new.steps):
            state["step"] = steps_now
        torch._foreach_copy_([s["momentum_buffer"] for s in states], new.momentum)
        seconds = [(s["exp_avg_sq"], v) for s, v in zip(states, new.exp_avg_sq)
                   if v is not None]
        if seconds:
            torch._foreach_copy_([s for s, _ in seconds], [v for _, v in seconds])
        directions = [d.to(p.dtype) for d, p in zip(directions, members)]
        if torch.compiler.is_compiling():
            # As tensor expressions (not foreach's or add_'s scalar arguments, which
            # torch.compile specializes on) so that a new lr does not recompile.
            for p, direction, lr, decay in zip(members, directions, lrs, decays):
                p.add_(direction * -lr - p * (lr * decay))
            return
        # One operation per list for the whole model, not four per parameter.
        if any(lr * decay for lr, decay in zip(lrs, decays)):
            torch._foreach_mul_(members, [1 - lr * decay for lr, decay in zip(lrs, decays)])
        torch._foreach_add_(members, torch._foreach_mul(directions, [-lr for lr in lrs]))

    @torch.compiler.disable
    def _sharded_step(self) -> None:
        """The step over the ranks of the process group
        (:mod:`matroot.optim.distributed.muon_step`), eager even inside ``torch.compile``."""
        pairs = [(p, g) for g in self.param_groups for p in g["params"]]
        sharded = self._sharding(pairs)
        self._check_states(pairs)
        if not sharded.step([p for p, _ in pairs], [g for _, g in pairs], self.state,
                            self.config):
            self.skipped_steps += 1

    def _sharding(self, pairs) -> ShardedMuon:
        """The split of the current parameters over the ranks (made again after
        ``add_param_group`` changed them)."""
        params = [p for p, _ in pairs]
        use_muon = [bool(g["use_muon"]) for _, g in pairs]
        splits = [int(g.get("split", 1)) if g["use_muon"] else 1 for _, g in pairs]
        if self._sharded is None or \
                self._sharded.key != ShardedMuon.key_of(params, use_muon, splits):
            self._sharded = ShardedMuon(params, use_muon, splits, self._process_group)
        return self._sharded

    def _make_states(self, params) -> None:
        """Zero state for each of ``params`` that has none (to load a checkpoint into),
        laid out as a step would make it."""
        pairs = [(p, g) for g in self.param_groups for p in g["params"]]
        sharded = None if self._process_group is None else self._sharding(pairs)
        wanted = {id(p) for p in params}
        for i, (p, group) in enumerate(pairs):
            if id(p) in wanted and not self.state[p]:
                self.state[p] = {"step": 0} | {
                    key: torch.zeros_like(p) if sharded is None else sharded.zeros(i, p)
                    for key in ("momentum_buffer",) + (() if group["use_muon"]
                                                       else ("exp_avg_sq",))}

    def _check_states(self, pairs) -> None:
        """Refuse sparse gradients and a state made under the other half's rule."""
        for p, group in pairs:
            if p.grad is not None and p.grad.is_sparse:
                raise TypeError("Muon does not support sparse gradients (an Embedding made "
                                "with sparse=True): make it dense, or give it to a sparse "
                                "optimizer")
            state = self.state[p]
            if state and ("exp_avg_sq" in state) == bool(group["use_muon"]):
                raise ValueError(
                    f"use_muon of the group of a parameter of shape {tuple(p.shape)} changed "
                    f"after its first step, and its state is "
                    f"{'AdamW' if 'exp_avg_sq' in state else 'Muon'}'s: to restart it with "
                    "the new rule, del optimizer.state[param] first")

    @torch.compiler.disable
    def _prepare_step(self):
        """The host side of a step, eager even inside ``torch.compile``: the parameters
        with gradients, their state (made at the first gradient), step counts and group
        values. Returned rather than read in the compiled part, so that a scheduler's
        new lr or momentum is an input of the graph, not a guard that recompiles it."""
        numbered = [(number, p, group) for number, (p, group) in enumerate(
            (p, group) for group in self.param_groups for p in group["params"])
            if p.grad is not None]
        pairs = [(p, group) for _, p, group in numbered]
        self._check_states(pairs)
        if not pairs:
            return None
        bad = nonfinite_params(torch, [p.grad for p, _ in pairs])
        if apply_nonfinite_policy([numbered[i][0] for i in bad], self.config.nonfinite_grads,
                                  numbering=" (state_dict numbering)"):
            self.skipped_steps += 1
            return None
        for p, group in pairs:
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["momentum_buffer"] = torch.zeros_like(p)
                if not group["use_muon"]:
                    state["exp_avg_sq"] = torch.zeros_like(p)
        groups = [group for _, group in pairs]
        # State dicts saved before groups carried momentum and betas lack them.
        return ([p for p, _ in pairs], [self.state[p] for p, _ in pairs],
                # torch.optim.Muon's checkpoints count no steps.
                [int(self.state[p].setdefault("step", 0)) for p, _ in pairs],
                [bool(g["use_muon"]) for g in groups], [float(g["lr"]) for g in groups],
                [float(g["weight_decay"]) for g in groups],
                [float(g.get("momentum", self.config.momentum)) for g in groups],
                [tuple(g.get("betas", self.config.betas)) for g in groups],
                [int(g.get("split", 1)) for g in groups])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``, after checking that every saved tensor has its
        parameter's shape (torch's loader does not look; a changed model then failed at
        the next step with a broadcasting error). Keys the saved groups lack (a
        torch.optim.Muon checkpoint has no ``use_muon``) take this optimizer's values."""
        state_dict = with_missing_group_keys(state_dict, self.param_groups)
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] == \
                [len(g["params"]) for g in self.param_groups]:
            numbers = (i for g in saved_groups for i in g["params"])
            params = (p for g in self.param_groups for p in g["params"])
            for number, p in zip(numbers, params):
                for key, value in state_dict["state"].get(number, {}).items():
                    if torch.is_tensor(value) and value.ndim and value.shape != p.shape:
                        raise ValueError(
                            f"the state dict's {key!r} of parameter {number} has shape "
                            f"{tuple(value.shape)} but that parameter has "
                            f"{tuple(p.shape)}: it was saved for another model; load it "
                            "into the model it was saved from")
        super().load_state_dict(state_dict)

    def __getstate__(self) -> dict[str, Any]:
        """torch's pickled state (``pickle``, ``copy.deepcopy``, ``torch.save(opt)``) plus
        Muon's settings, which torch's leaves out (a copy then failed at its next step)."""
        if self._process_group not in (None, dist.group.WORLD):
            raise TypeError("a Muon sharded over a process group other than the default one "
                            "cannot be pickled or deep-copied; save its state_dict() and "
                            "load it into a new optimizer instead")
        return {**super().__getstate__(), "_muon": (
            self.config, self._split_defaults, self.skipped_steps,
            self._process_group is not None)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        muon = state.pop("_muon", None)
        super().__setstate__(state)
        if muon is not None:            # unpickled (load_state_dict passes none)
            self.config, self._split_defaults, self.skipped_steps, sharded = muon
            self._sharded = None        # made again at the next step
            self._process_group = resolve_process_group("auto" if sharded else None)

    def __repr__(self) -> str:
        """torch's (every group's values: ``lr`` as a scheduler left it), then the
        optimizer-wide :class:`~matroot.optim.muon.core.MuonConfig`."""
        options = ", ".join(f"{f.name}={getattr(self.config, f.name)!r}"
                            for f in dataclasses.fields(self.config))
        return f"{super().__repr__()[:-1]}Options: {options}\n)"
