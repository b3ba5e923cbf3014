"""The torch shell's Muon step over the ranks of a process group (DDP, FSDP2, DTensor).

Each rank keeps the state of its part of every parameter, a ``torch.chunk`` of one
dimension (:func:`~matroot.optim.distributed.muon_owners.row_ranges`) or, on one
rank, all of it, stored as a ``DTensor`` of the parameter's shape (``Shard(dim)``,
or ``Replicate`` on that rank's mesh), so ``torch.distributed.checkpoint`` reshards
it (:mod:`matroot.optim.distributed.muon_checkpoint`). A parameter is either

- **row-sharded**: a ``DTensor`` placed ``Shard(0)`` on a 1-D mesh of the
  optimizer's ranks, as ``fully_shard`` makes it. Its gradient's local part is
  this rank's rows, so its state is those rows (``fully_shard``'s split sets this
  rank's share: ``ceil(rows/world)/rows`` at most); its update's rows are added to
  its local part, with no more communication; or
- **whole** on every rank: a plain tensor (DDP), a ``Replicate`` DTensor, or any
  other placement (HSDP's 2-D mesh, ``Shard(1)``): its gradient is made whole
  (``full_tensor()`` for a DTensor), the rank takes its part, and one all-gather
  per dtype gives every rank every part of the update. The parts follow a
  size-balanced plan (:func:`~matroot.optim.distributed.muon_layout.plan_state`):
  chunks of the better dimension (the columns of a ``(3, 512)`` matrix at 4 ranks,
  a quarter each, where its rows would give rank 0 a third), or the whole
  parameter on the least-loaded rank.

Muon's matrices then go to their owners and back
(:class:`~matroot.optim.distributed.muon_owners.MatrixOwners`); AdamW's
update is elementwise and stays on the rows. Every rank enters the same
collectives in the same order: which parameters have gradients is agreed first
(:func:`~matroot.optim.distributed.core.agree_on_gradients`), and every size
follows from the shapes alone.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..shampoo_core.gradients import apply_nonfinite_policy
from ..muon.core import MuonConfig, adamw_directions, muon_momentum, orthogonalized
from .core import _all_gather, _check_device, agree_on_gradients, agree_on_parameters
from .dtensor import _local_rows, is_dtensor, whole
from .muon_layout import plan_state
from .muon_owners import MatrixOwners

__all__ = ["ShardedMuon"]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class ShardedMuon:
    """The sharded step for one list of parameters (all of a Muon's, in group order).

    Parameters
    ----------
    params : list of tensors
    use_muon : list of bool
    splits : list of int
        Each Muon parameter's ``split`` (1 for AdamW's).
    group : ProcessGroup
    """

    def __init__(self, params, use_muon, splits, group):
        from torch.distributed.device_mesh import DeviceMesh

        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.device = params[0].device
        agree_on_parameters(params, group, is_dtensor)
        self.key = self.key_of(params, use_muon, splits)
        self.use_muon = list(use_muon)
        ranks = dist.get_process_group_ranks(group)
        self.row_sharded = [self._row_sharded(p, ranks) for p in params]
        # A scalar has no rows: every rank keeps its state and computes its update.
        self.scalar = [p.ndim == 0 for p in params]
        # Each parameter's part of the state (FSDP2's rows, else a size-balanced plan);
        # a whole parameter on one rank needs that rank's own mesh, which every rank of
        # the default group makes: only when the optimizer's group is all of them.
        hold = self.world == dist.get_world_size()
        self.layout = plan_state([tuple(p.shape) for p in params], use_muon,
                                 self.row_sharded,
                                 [p.element_size() * (1 if u else 2)
                                  for p, u in zip(params, use_muon)], self.world, hold)
        self.muon = [i for i, u in enumerate(use_muon) if u]
        self.owners = MatrixOwners([tuple(params[i].shape) for i in self.muon],
                                   [_dtype_name(params[i].dtype) for i in self.muon],
                                   [splits[i] for i in self.muon], self.world, self.rank,
                                   [self.layout[i].dim for i in self.muon],
                                   [self.layout[i].ranges for i in self.muon])
        self.mesh = DeviceMesh.from_group(group, self.device.type)
        self._holder_meshes = {r: DeviceMesh(self.device.type, [ranks[r]]) for r in
                               sorted({part.holder for part in self.layout
                                       if part is not None and part.holder is not None})}
        #: Bytes the all-gathers of whole parameters' updates returned here so far.
        self.gathered_bytes = 0

    @staticmethod
    def key_of(params, use_muon, splits) -> tuple:
        """What the split depends on: rebuilt when it changes (``add_param_group``)."""
        return tuple((id(p), bool(u), int(s)) for p, u, s in zip(params, use_muon, splits))

    @staticmethod
    def _row_sharded(p, ranks) -> bool:
        """Whether ``p`` is a DTensor whose local part is this rank's rows: ``Shard(0)``
        on a 1-D mesh of exactly the optimizer's ranks, in order."""
        if not is_dtensor(p) or p.device_mesh.ndim != 1:
            return False
        from torch.distributed.tensor import Shard

        return (tuple(p.placements) == (Shard(0),)
                and p.device_mesh.mesh.flatten().tolist() == list(ranks))

    def part(self, i: int, tensor, rank: int | None = None):
        """``rank``'s (default this one's) part of the whole ``tensor`` (of parameter
        ``i``'s shape): its chunk of the plan's dimension."""
        layout = self.layout[i]
        start, stop = layout.ranges[self.rank if rank is None else rank]
        return tensor.narrow(layout.dim, start, stop - start)

    def part_shape(self, i: int, shape, rank: int | None = None) -> tuple[int, ...]:
        """The shape of ``rank``'s part of parameter ``i`` (of ``shape``)."""
        return self.layout[i].shape(shape, self.rank if rank is None else rank)

    def zeros(self, i: int, p):
        """Zero state for parameter ``i``: a DTensor of ``p``'s shape holding this
        rank's part (``Shard`` of its dimension, or ``Replicate`` on its holder's mesh)."""
        if self.row_sharded[i] or self.scalar[i]:
            return torch.zeros_like(p)
        from torch.distributed.tensor import DTensor, Replicate, Shard

        layout = self.layout[i]
        local = torch.zeros(self.part_shape(i, p.shape), dtype=p.dtype, device=p.device)
        mesh, placement = ((self.mesh, Shard(layout.dim)) if layout.holder is None else
                           (self._holder_meshes[layout.holder], Replicate()))
        return DTensor.from_local(local, mesh, [placement], run_check=False,
                                  shape=p.shape, stride=_contiguous_strides(p.shape))

    def local(self, i: int, tensor):
        """This rank's part of state ``tensor`` of parameter ``i``, shaped as its part of
        the gradient (a DTensor on another rank's mesh keeps an empty 1-D local tensor)."""
        local = _local(tensor)
        if local.numel() == 0 and not self.scalar[i]:
            return local.reshape(self.part_shape(i, tensor.shape))
        return local

    def _own_rows(self, i: int, p, s: dict) -> None:
        """Cut whole state tensors (a single-process state dict given to
        ``load_state_dict``) to this rank's part, in place in ``s``."""
        for key in ("momentum_buffer", "exp_avg_sq"):
            value = s.get(key)
            if value is None or is_dtensor(value) or self.scalar[i]:
                continue
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"the state's {key!r} of a parameter of shape "
                                 f"{tuple(p.shape)} has shape {tuple(value.shape)}")
            kept = self.zeros(i, p)
            self.local(i, kept).copy_(self.part(i, value))
            s[key] = kept

    def _local_grad(self, i: int, p, grad):
        if self.row_sharded[i]:
            if tuple(grad.placements) != tuple(p.placements):
                grad = grad.redistribute(p.device_mesh, p.placements)
            return grad.to_local()
        if self.scalar[i]:
            return whole(grad)
        return self.part(i, whole(grad))

    def step(self, params, groups, state, config: MuonConfig) -> bool:
        """One step of every parameter with a gradient (``groups[i]``: its group dict,
        ``state[p]``: its state, made here at its first gradient); False when
        ``config.nonfinite_grads`` skips it (the same answer on every rank)."""
        # Raises on every rank if some lack a gradient; every rank sees the same NaN/Inf
        # flags, so all raise or all skip, as one process would.
        nonfinite = agree_on_gradients(
            [None if p.grad is None else (p.grad.to_local() if is_dtensor(p.grad) else p.grad)
             for p in params], self.group, self.device)
        if apply_nonfinite_policy([i for i, bad in enumerate(nonfinite) if bad],
                                  config.nonfinite_grads, numbering=" (state_dict numbering)"):
            return False
        live = [i for i, p in enumerate(params) if p.grad is not None]
        if not live:
            return True
        for i in live:
            s = state[params[i]]
            if not s:
                s["step"] = 0
                s["momentum_buffer"] = self.zeros(i, params[i])
                if not self.use_muon[i]:
                    s["exp_avg_sq"] = self.zeros(i, params[i])
            self._own_rows(i, params[i], s)
        grads = {i: self._local_grad(i, params[i], params[i].grad) for i in live}
        buffers = {i: self.local(i, state[params[i]]["momentum_buffer"]) for i in live}
        for i in live:
            state[params[i]]["step"] = int(state[params[i]]["step"]) + 1
        directions = {}
        muon = [i for i in live if self.use_muon[i]]
        if muon:
            new, inputs = muon_momentum([grads[i] for i in muon], [buffers[i] for i in muon],
                                        [float(groups[i].get("momentum", config.momentum))
                                         for i in muon], config.nesterov)
            torch._foreach_copy_([buffers[i] for i in muon], new)
            directions.update(self._orthogonalized(dict(zip(muon, inputs)), config))
        adamw = [i for i in live if not self.use_muon[i]]
        if adamw:
            seconds = [self.local(i, state[params[i]]["exp_avg_sq"]) for i in adamw]
            first, squares, steps = adamw_directions(
                [grads[i] for i in adamw], [buffers[i] for i in adamw], seconds,
                [state[params[i]]["step"] for i in adamw],
                [tuple(groups[i].get("betas", config.betas)) for i in adamw], config.eps)
            torch._foreach_copy_([buffers[i] for i in adamw] + seconds, first + squares)
            directions.update(zip(adamw, steps))
        self._apply(params, groups, live, directions)
        return True

    def _orthogonalized(self, inputs: dict, config: MuonConfig) -> dict:
        """This rank's part of every Muon direction, each matrix factored by its owner."""
        number = {i: k for k, i in enumerate(self.muon)}
        present = [i in inputs for i in self.muon]
        whole_matrices = self.owners.to_owners({number[i]: u for i, u in inputs.items()},
                                               present, self.group, self.device)
        factors = orthogonalized(whole_matrices, config, {})
        rows = self.owners.from_owners(factors, present, self.group, self.device)
        return {i: rows[number[i]] for i in inputs}

    def _apply(self, params, groups, live, directions) -> None:
        """``p ← p·(1 − lr·wd) − lr·D``, as one process does it, on each rank's part."""
        spread = [i for i in live if not (self.row_sharded[i] or self.scalar[i])]
        wholes = dict(zip(spread, self._gather_parts(spread, [params[i] for i in spread],
                                                     [directions[i] for i in spread])))
        for i in live:
            p, lr, decay = params[i], float(groups[i]["lr"]), float(groups[i]["weight_decay"])
            direction = wholes.get(i, directions[i])
            target = p.to_local() if is_dtensor(p) else p.detach()
            if is_dtensor(p) and not self.row_sharded[i] and not self.scalar[i]:
                direction = _local_rows(direction, p)
            direction = direction.to(p.dtype)
            if lr * decay:
                target.mul_(1 - lr * decay)
            target.add_(direction * -lr)

    def _gather_parts(self, numbers, params, rows) -> list:
        """Whole directions of ``params`` (numbered ``numbers``) from every rank's part
        ``rows``: one all-gather per dtype."""
        out: list = [None] * len(params)
        for dtype in sorted({r.dtype for r in rows}, key=str):
            members = [k for k, r in enumerate(rows) if r.dtype == dtype]
            sizes = [[math.prod(self.part_shape(numbers[k], params[k].shape, r))
                      for k in members] for r in range(self.world)]
            padded = max(sum(s) for s in sizes)
            send = torch.zeros(padded, dtype=dtype, device=self.device)
            mine = torch.cat([rows[k].reshape(-1) for k in members])
            send[:mine.numel()] = mine
            recv = torch.empty(self.world * padded, dtype=dtype, device=self.device)
            _check_device(self.group, self.device)
            _all_gather(recv, send, self.group)
            self.gathered_bytes += recv.numel() * recv.element_size()
            recv = recv.view(self.world, padded)
            for k in members:
                out[k] = torch.empty(params[k].shape, dtype=dtype, device=self.device)
            for r in range(self.world):
                parts = recv[r, :sum(sizes[r])].split(sizes[r])
                for k, part in zip(members, parts):
                    target = self.part(numbers[k], out[k], r)
                    target.copy_(part.view(target.shape))
        return out


def _contiguous_strides(shape) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``."""
    return tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))


def _local(tensor):
    return tensor.to_local() if is_dtensor(tensor) else tensor
