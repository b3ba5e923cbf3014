"""Shampoo's block work split over ``torch.distributed`` ranks.

Under data parallelism every rank holds the same (averaged) gradients, so every
rank would compute the same factors, inverse roots and preconditioned blocks.
:class:`BlockSharding` splits that work instead: with the balanced, contiguous split
of :func:`matroot.optim.sharding.shard_plan`, each rank keeps factor and root stacks
for its own blocks only (the core runs on the rank's
:func:`~matroot.optim.sharding.local_plan`), computes their updates, and one
all-gather per dtype (:func:`~matroot.optim.sharding.gather_buckets`)
copies every block's update from its owner to all ranks, at every step. A rank
keeps the moments of the parameters it owns a block of (each rank owns one piece
of the model, so most parameters have one owner) and of the elementwise
(AdamW) parameters, which stay replicated; a parameter whose blocks all belong to
other ranks costs this rank nothing but its transient update.

Every rank enters the same collectives in the same order at every step,
whatever happens locally: the buckets and their sizes depend on the plan alone,
a rank whose roots failed still sends its (fallback) updates, and the gradient
check (:func:`agree_on_gradients`) is itself a collective, so all ranks raise or
skip together.

Backends: whatever the process group runs. Buffers live on the parameters'
device, so gloo works on CPU tensors and NCCL on CUDA tensors.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .blocking import ELEMENTWISE, BlockPlan
# Re-exported: the state dicts of sharded runs are this module's public API too.
from .resharding import check_shard, consolidate_state_dicts, shard_state_dict, slot_map
from .sharding import gather_buckets, local_plan, shard_plan

__all__ = [
    "BlockSharding",
    "resolve_process_group",
    "agree_on_gradients",
    "GradientMismatchError",
    "check_shard",
    "slot_map",
    "consolidate_state_dicts",
    "shard_state_dict",
]


def _all_gather(output, tensor, group) -> None:
    """Every rank's ``tensor``, concatenated into ``output``: one collective."""
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor, group=group)


class GradientMismatchError(RuntimeError):
    """Some ranks have a gradient for a parameter and others have none."""


def resolve_process_group(distributed):
    """The process group to shard over, or None to run as a single process.

    Parameters
    ----------
    distributed : "auto", None, False or ProcessGroup
        ``"auto"``: the default group when ``torch.distributed`` is initialised
        and has more than one rank; None/False: never shard; a ProcessGroup:
        that group (a world of one runs unsharded).

    Returns
    -------
    ProcessGroup or None
        None for a world of one, so that case takes the single-process path.

    Raises
    ------
    ValueError
        For any other value, or a group given while ``torch.distributed`` is
        not initialised.
    """
    if distributed is None or distributed is False:
        return None
    if isinstance(distributed, str):
        if distributed != "auto":
            raise ValueError(f"distributed must be 'auto', None or a ProcessGroup, "
                             f"got {distributed!r}")
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = dist.group.WORLD
    elif dist.is_available() and isinstance(distributed, dist.ProcessGroup):
        if not dist.is_initialized():
            raise ValueError("a process group was given but torch.distributed is not "
                             "initialised")
        group = distributed
    else:
        raise ValueError(f"distributed must be 'auto', None or a ProcessGroup, "
                         f"got {distributed!r}")
    return group if dist.get_world_size(group) > 1 else None


def _check_device(group, device: torch.device) -> None:
    """Refuse tensors the group's backend cannot send (NCCL takes CUDA tensors only)."""
    if dist.get_backend(group) == "nccl" and device.type != "cuda":
        raise ValueError("the process group runs NCCL, which needs CUDA tensors, but the "
                         f"parameters are on {device}; use gloo for CPU parameters")


def agree_on_gradients(grads, group, device):
    """Which parameters have a gradient and which hold NaN/Inf, agreed by all ranks.

    One ``all_reduce`` of ``2·len(grads)`` integers and one host sync. Every
    rank returns the same answer, so every rank takes the same branch
    (continue, skip or raise) and none waits in a collective the others left.

    Parameters
    ----------
    grads : sequence of tensors or None
        This rank's gradients, in the optimizer's parameter order.
    group : ProcessGroup
    device : torch.device
        The parameters' device (CUDA for NCCL).

    Returns
    -------
    nonfinite : list of bool
        True where the gradient holds NaN/Inf on at least one rank.

    Raises
    ------
    GradientMismatchError
        On every rank, when a parameter has a gradient on some ranks only.
    """
    _check_device(group, device)
    count = len(grads)
    flags = torch.zeros(2 * count, dtype=torch.int32, device=device)
    present = [i for i, g in enumerate(grads) if g is not None]
    if present:
        index = torch.tensor(present, device=device)
        finite = torch.stack([torch.isfinite(grads[i]).all().to(device) for i in present])
        flags[index] = 1
        flags[index + count] = (~finite).to(torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.SUM, group=group)
    flags = flags.tolist()
    world = dist.get_world_size(group)
    uneven = [i for i in range(count) if flags[i] not in (0, world)]
    if uneven:
        raise GradientMismatchError(
            f"parameters {uneven} have a gradient on only some of the {world} ranks "
            f"(on {[flags[i] for i in uneven]} ranks); sharded Shampoo needs the same "
            "parameters to have gradients on every rank (set unused gradients to zeros)")
    return [flags[count + i] > 0 for i in range(count)]


class BlockSharding:
    """One parameter family's blocks split over the ranks of a process group.

    Parameters
    ----------
    plan : BlockPlan
        The family's full plan (:func:`matroot.optim.core.make_plan`).
    group : ProcessGroup

    Attributes
    ----------
    plan : BlockPlan
        The full plan, as a single process would use it.
    split : ShardPlan
        Blocks of each group per rank.
    local : BlockPlan
        This rank's part: the plan its core state is built on.
    buckets : list of GatherBucket
        The all-gathers of :meth:`share_updates`, in order.
    """

    def __init__(self, plan: BlockPlan, group):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.plan = plan
        self.split = shard_plan(plan, self.world_size)
        self.local, self.owned = local_plan(plan, self.split, self.rank)
        self.buckets = gather_buckets(plan, self.split)

    def _bucket_blocks(self, bucket, rank):
        """``(block, shape)`` of the blocks of ``bucket`` that ``rank`` owns, in the order
        it packs them."""
        out = []
        for g in bucket.groups:
            start, stop = self.split.ranges(g)[rank]
            group = self.plan.groups[g]
            out.extend((block, group.shape) for block in group.blocks[start:stop])
        return out

    def share_updates(self, updates) -> int:
        """Give every rank the updates of all blocks, each from the rank that owns it.

        On entry each rank's ``updates`` are right for its own blocks (and for
        the elementwise parameters, which every rank computes); on return every
        block of every rank holds its owner's values, bit for bit. One
        ``all_gather`` per bucket (per dtype), entered by every rank in the same order.

        Parameters
        ----------
        updates : list of tensors or None
            Parameter-shaped updates in the family's order, changed in place
            (a non-contiguous entry is replaced by a contiguous copy first).
            None (no gradient this step, on every rank) is skipped.

        Returns
        -------
        int
            Bytes of the all-gather outputs on this rank (padding included).
        """
        present = [u for u in updates if u is not None]
        if not present:
            return 0
        device = present[0].device
        _check_device(self.group, device)
        views = [None] * len(updates)
        for i, (u, layout) in enumerate(zip(updates, self.plan.params)):
            if u is not None and layout.kind != ELEMENTWISE:
                # Blocks are written through a view, so the update must be contiguous;
                # the caller applies the list entries, so replacing one is seen.
                updates[i] = u if u.is_contiguous() else u.contiguous()
                views[i] = updates[i].view(layout.view)
        gathered = 0
        for bucket in self.buckets:
            dtype = getattr(torch, bucket.dtype)
            send = torch.zeros(bucket.padded, dtype=dtype, device=device)
            offset = 0
            for block, shape in self._bucket_blocks(bucket, self.rank):
                size = math.prod(shape)
                if views[block.param] is not None:
                    send[offset:offset + size] = views[block.param][block.index].reshape(-1)
                offset += size
            recv = torch.empty(self.world_size * bucket.padded, dtype=dtype, device=device)
            _all_gather(recv, send, self.group)
            gathered += recv.numel() * recv.element_size()
            recv = recv.view(self.world_size, bucket.padded)
            for rank in range(self.world_size):
                if rank == self.rank:
                    continue
                offset = 0
                for block, shape in self._bucket_blocks(bucket, rank):
                    size = math.prod(shape)
                    if views[block.param] is not None:
                        received = recv[rank, offset:offset + size]
                        views[block.param][block.index] = received.view(shape)
                    offset += size
        return gathered

    def record(self) -> dict:
        """The split as it goes into this rank's state dict."""
        return {"world_size": self.world_size, "rank": self.rank,
                "split": self.split.to_dict()}
