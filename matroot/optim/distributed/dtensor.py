"""DTensor parameters (FSDP2 ``fully_shard``, HSDP, ``distribute_tensor``) in the torch shell.

Shampoo's blocks are cut from whole parameters, so that a run's results do not
depend on how the parameters are sharded. For a ``DTensor`` parameter the shell
therefore works on whole tensors and gives each rank back its own part:

1. :func:`whole` gathers the gradient (one all-gather over the DTensor's mesh:
   ``full_tensor()``), and the parameter too where weight decay needs it;
2. the core and :class:`~matroot.optim.distributed.core.BlockSharding` run exactly
   as under DDP: each rank updates the blocks it owns and one all-gather per
   dtype gives every rank every block's update;
3. :func:`add_to_local` adds this rank's rows of that whole update to its
   shard (``redistribute`` from ``Replicate`` to the parameter's placements, a
   local slice without communication).

Every rank sees the same whole gradients, so every rank takes the same
decisions (skip, raise, fall back); with a given optimizer process group the
result equals the unsharded run's to rounding at any world size and mesh shape.
The cost is transient: one whole gradient per parameter during the step, and
the all-gather traffic of :mod:`matroot.optim.distributed.core` plus the gradients'.
"""

from __future__ import annotations

import torch

__all__ = ["is_dtensor", "whole", "local_view", "add_to_local", "add_all_to_local"]


def is_dtensor(tensor) -> bool:
    """Whether ``tensor`` is a ``torch.distributed.tensor.DTensor``."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(tensor, DTensor)


def whole(tensor):
    """The whole value of ``tensor`` on every rank: ``full_tensor()`` of a DTensor (a
    collective every rank of its mesh must enter), ``tensor`` itself otherwise."""
    if tensor is None or not is_dtensor(tensor):
        return tensor
    return tensor.full_tensor()


def local_view(tensor):
    """This rank's part of ``tensor``: ``to_local()`` of a DTensor (its storage, so
    writes reach the parameter), ``tensor`` itself otherwise."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def _local_rows(update: torch.Tensor, like) -> torch.Tensor:
    """The part of the whole ``update`` that rank holds of the DTensor ``like``."""
    from torch.distributed.tensor import DTensor, Replicate

    replicated = DTensor.from_local(update, like.device_mesh,
                                    [Replicate()] * like.device_mesh.ndim, run_check=False)
    part = replicated.redistribute(like.device_mesh, like.placements).to_local()
    local = like.to_local()
    if part.shape != local.shape:
        raise RuntimeError(f"the update's local part has shape {tuple(part.shape)} but the "
                           f"parameter's shard has {tuple(local.shape)}")
    return part


def add_to_local(param: torch.Tensor, update: torch.Tensor) -> None:
    """``param += update`` for a whole-parameter ``update``, on this rank's part of
    ``param`` (computed in the update's dtype and cast back)."""
    if is_dtensor(param):
        update = _local_rows(update, param)
    target = local_view(param)
    if update.dtype == target.dtype:
        target.add_(update)
    else:
        target.copy_(target.to(update.dtype) + update)


def add_all_to_local(params, updates) -> None:
    """:func:`add_to_local` of each pair; the plain parameters whose dtype is their
    update's in one foreach addition (one operation whatever their number)."""
    plain = [(p, u) for p, u in zip(params, updates)
             if not is_dtensor(p) and p.dtype == u.dtype]
    if plain:
        torch._foreach_add_([p.detach() for p, _ in plain], [u for _, u in plain])
    done = {id(p) for p, _ in plain}
    for p, u in zip(params, updates):
        if id(p) not in done:
            add_to_local(p, u)
