"""Shampoo's block work split over ``torch.distributed`` ranks.

Under data parallelism every rank holds the same (averaged) gradients, so every
rank would compute the same factors, inverse roots and preconditioned blocks.
:class:`BlockSharding` splits that work instead: with the balanced, contiguous split
of :func:`matroot.optim.distributed.sharding.shard_plan`, each rank keeps factor and root stacks
for its own blocks only, moments for exactly the elements of its blocks and of its
elementwise (AdamW) parameters, each owned whole by one rank. Its core runs on the
rank's :func:`~matroot.optim.distributed.rank_part.piece_plan`, whose parameters are the
rectangles of the model it owns, and one all-gather per dtype
(:func:`~matroot.optim.distributed.sharding.gather_buckets`) copies every block's and every
elementwise parameter's update from its owner to all ranks, at every step. No
moment is kept twice: of a parameter cut between ranks, each keeps its own elements'.

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
import zlib

import torch
import torch.distributed as dist

from ..shampoo_core.blocking import BlockPlan
# Re-exported: the state dicts of sharded runs are this module's public API too.
from .resharding import check_shard, consolidate_state_dicts, shard_state_dict, slot_map
from .rank_part import local_plan, piece_plan, rank_pieces
from .sharding import gather_buckets, shard_plan

__all__ = [
    "BlockSharding",
    "resolve_process_group",
    "agree_on_gradients",
    "agree_on_parameters",
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


def _size(layout, index) -> int:
    """Elements of a block at ``index`` of a parameter's view (the whole one: None)."""
    if index is None:
        return math.prod(layout.shape)
    return math.prod(s.stop - s.start for s in index)


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


def agree_on_parameters(params, group, is_split) -> None:
    """Refuse to shard over ranks that hold different models, on every rank alike.

    Sharding splits the block work of *one* model over its data-parallel
    replicas. Ranks with parameters of other shapes (pipeline or tensor parallel
    stages) would enter collectives of other sizes and crash or hang; ranks with
    other values (per-rank models, expert parallelism) would silently take each
    other's updates. One all-gather of three numbers per rank, when parameters get
    their stacks (the first step, after ``add_param_group``): the shapes' and
    dtypes' checksum and a weighted float64 sum of the values (of parameters that
    ``is_split(p)`` says are split between ranks, such as FSDP's, the shapes only).

    Raises
    ------
    ValueError
        On every rank, naming what differs and ``distributed=None``.
    """
    device = params[0].device
    _check_device(group, device)
    layout = repr([(tuple(p.shape), str(p.dtype)) for p in params]).encode()
    values = sum((i + 1) * torch.nan_to_num(p.detach().double()).sum()
                 for i, p in enumerate(params) if not is_split(p))
    mine = torch.stack([torch.tensor(float(len(params)), dtype=torch.float64, device=device),
                        torch.tensor(float(zlib.crc32(layout)), dtype=torch.float64,
                                     device=device),
                        torch.as_tensor(values, dtype=torch.float64, device=device)])
    world = dist.get_world_size(group)
    everyone = torch.empty(3 * world, dtype=torch.float64, device=device)
    _all_gather(everyone, mine, group)
    rows = everyone.reshape(world, 3).tolist()
    advice = ("a sharded optimizer (distributed='auto') splits one model's work over "
              "data-parallel replicas; for pipeline, tensor or expert parallelism or "
              "per-rank models pass distributed=None, or a process group of replicas")
    if any(row[:2] != rows[0][:2] for row in rows):
        raise ValueError("the ranks hold parameters of different shapes or dtypes "
                         f"(counts {[int(row[0]) for row in rows]}): " + advice)
    if any(row[2] != rows[0][2] for row in rows):
        raise ValueError("the ranks' parameters have different values at their first "
                         "step (DDP makes them equal; without it, seed every rank alike): "
                         + advice)


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
            f"(on {[flags[i] for i in uneven]} ranks); a sharded optimizer needs the same "
            "parameters to have gradients on every rank (set unused gradients to zeros)")
    return [flags[count + i] > 0 for i in range(count)]


class BlockSharding:
    """One parameter family's blocks split over the ranks of a process group.

    Parameters
    ----------
    plan : BlockPlan
        The family's full plan (:func:`matroot.optim.shampoo_core.core.make_plan`).
    group : ProcessGroup
    dtypes : sequence of str
        Each parameter's update dtype (:func:`~matroot.optim.shampoo_core.core.compute_dtype_name`).

    Attributes
    ----------
    plan : BlockPlan
        The full plan, as a single process would use it.
    split : ShardPlan
        Blocks of each group per rank, and the owner of each elementwise parameter.
    pieces : tuple of Piece
        The rectangles of the parameters this rank owns (its blocks, its elementwise
        parameters): where it keeps moments (:mod:`matroot.optim.distributed.rank_part`).
    local : BlockPlan
        The plan this rank's core state is built on: one parameter per piece.
    buckets : list of GatherBucket
        The all-gathers of :meth:`share_updates`, in order.
    """

    def __init__(self, plan: BlockPlan, group, dtypes):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.plan = plan
        self.split = shard_plan(plan, self.world_size)
        self.pieces = rank_pieces(plan, self.split, self.rank)
        self.local = piece_plan(plan, self.split, self.rank, self.pieces)
        self.buckets = gather_buckets(plan, self.split, list(dtypes))
        owned = local_plan(plan, self.split, self.rank)[1]
        self._local_group = {g: j for j, (g, _, _) in enumerate(owned)}

    def pieces_of(self, param: int) -> list:
        """This rank's pieces of parameter ``param`` (none where it owns no element)."""
        return [piece for piece in self.pieces if piece.param == param]

    def local_parts(self, arrays) -> list:
        """This rank's pieces of whole-parameter ``arrays`` (None stays None), in the
        order of :attr:`local`'s parameters."""
        return [None if arrays[piece.param] is None
                else piece.of(arrays[piece.param], self.plan.params[piece.param])
                for piece in self.pieces]

    def _received_items(self, bucket, rank) -> list:
        """``(param, index)`` of what ``rank`` packs into ``bucket``, in order: its blocks
        (``index`` the block's place in the parameter's view), then its elementwise
        parameters (``index`` None: the whole parameter)."""
        out: list[tuple[int, tuple | None]] = []
        for g in bucket.groups:
            start, stop = self.split.ranges(g)[rank]
            out.extend((block.param, block.index)
                       for block in self.plan.groups[g].blocks[start:stop])
        owner = dict(self.split.elementwise)
        return out + [(i, None) for i in bucket.elementwise if owner[i] == rank]

    def _sent_items(self, bucket) -> list:
        """This rank's items of :meth:`_received_items`, as ``(piece number, index in
        the piece)``."""
        out: list[tuple[int, tuple | None]] = []
        for g in bucket.groups:
            if g in self._local_group:
                out.extend((block.param, block.index)
                           for block in self.local.groups[self._local_group[g]].blocks)
        whole = {piece.param: k for k, piece in enumerate(self.pieces) if piece.index is None}
        return out + [(whole[i], None) for i in bucket.elementwise if i in whole]

    def share_updates(self, local_updates, present, device) -> tuple[list, int]:
        """Every parameter's whole update, each block and elementwise parameter from the
        rank that owns it.

        One ``all_gather`` per bucket (per dtype), entered by every rank in the same
        order whatever it owns; every rank ends with the same updates, bit for bit.

        Parameters
        ----------
        local_updates : list of tensors or None
            This rank's updates, one per piece (:attr:`local`'s parameters).
        present : sequence of bool
            Per parameter, whether it has a gradient this step (the same on every rank).
        device : torch.device
            The parameters' device.

        Returns
        -------
        updates : list of tensors or None
            Parameter-shaped updates in the family's order (None where not ``present``).
        gathered : int
            Bytes of the all-gather outputs on this rank (padding included).
        """
        updates: list = [None] * len(self.plan.params)
        if not any(present):
            return updates, 0
        _check_device(self.group, device)
        gathered = 0
        for bucket in self.buckets:
            dtype = getattr(torch, bucket.dtype)
            send = torch.zeros(bucket.padded, dtype=dtype, device=device)
            offset = 0
            for number, index in self._sent_items(bucket):
                update = local_updates[number]
                size = _size(self.local.params[number], index)
                if update is not None:
                    send[offset:offset + size] = (update if index is None
                                                  else update[index]).reshape(-1)
                offset += size
            recv = torch.empty(self.world_size * bucket.padded, dtype=dtype, device=device)
            _all_gather(recv, send, self.group)
            gathered += recv.numel() * recv.element_size()
            recv = recv.view(self.world_size, bucket.padded)
            for rank in range(self.world_size):
                offset = 0
                for param, index in self._received_items(bucket, rank):
                    layout = self.plan.params[param]
                    size = _size(layout, index)
                    if present[param]:
                        if updates[param] is None:
                            updates[param] = torch.empty(layout.shape, dtype=dtype,
                                                         device=device)
                        target = updates[param] if index is None else \
                            updates[param].view(layout.view)[index]
                        target.copy_(recv[rank, offset:offset + size].view(target.shape))
                    offset += size
        return updates, gathered

    def record(self) -> dict:
        """The split as it goes into this rank's state dict."""
        return {"world_size": self.world_size, "rank": self.rank,
                "split": self.split.to_dict()}
