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

from .blocking import ELEMENTWISE, BlockPlan, FactorPolicy, plan_blocks
from .checkpoint import plan_from_layout
from .preconditioner import empty_stack
from .sharding import ShardPlan, gather_buckets, local_plan, shard_plan

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


def check_shard(saved, sharding) -> None:
    """Refuse a family record that was saved under another split than ``sharding``'s.

    Parameters
    ----------
    saved : dict or None
        The record's ``"shard"`` entry (None for a single-process state dict).
    sharding : BlockSharding or None
        The loading optimizer's split (None when it runs unsharded).

    Raises
    ------
    ValueError
        Naming the function that converts the state dict.
    """
    if saved is None and sharding is None:
        return
    if saved is None:
        raise ValueError(
            "a single-process Shampoo state dict cannot be loaded by a sharded optimizer "
            f"(rank {sharding.rank} of {sharding.world_size}); convert it with "
            "matroot.optim.distributed.shard_state_dict(state_dict, world_size, rank)")
    if sharding is None:
        raise ValueError(
            f"this state dict is rank {saved['rank']}'s shard of a {saved['world_size']}-rank "
            "run; merge every rank's with matroot.optim.distributed.consolidate_state_dicts "
            "to load it without torch.distributed")
    if int(saved["world_size"]) != sharding.world_size or int(saved["rank"]) != sharding.rank:
        raise ValueError(
            f"this state dict is rank {saved['rank']}'s shard of a {saved['world_size']}-rank "
            f"run, loaded on rank {sharding.rank} of {sharding.world_size}; use "
            "consolidate_state_dicts and shard_state_dict to change the world size")
    if ShardPlan.from_dict(saved["split"]) != sharding.split:
        raise ValueError("the state dict was saved under a different split of the blocks "
                         "(other parameters or block_size?)")


def _plan_of_family(state_dict: dict, entry: dict) -> BlockPlan:
    """Rebuild a family's full plan from a state dict: its layout, or (first format) the
    moments' shapes and dtypes with the group's settings."""
    if "layout" in entry:
        return plan_from_layout(entry["layout"], block_size=entry["block_size"],
                                stacked=entry["stacked"])
    groups = {i: g for g in state_dict["param_groups"] for i in g["params"]}
    members = entry["params"]
    config = groups[members[0]]
    shapes, dtypes = [], []
    for i in members:
        moment = state_dict["state"][i]["exp_avg"]
        shapes.append(tuple(moment.shape))
        dtypes.append("float64" if moment.dtype == torch.float64 else "float32")
    return plan_blocks(shapes, dtypes, block_size=int(config["block_size"]),
                       policy=FactorPolicy(precondition_1d=bool(config["precondition_1d"])),
                       stacked=bool(config["stacked"]))


def slot_map(plan: BlockPlan, split: ShardPlan, rank: int) -> list:
    """Where rank ``rank``'s factor slots sit in the full plan's stacks.

    Returns
    -------
    list of (int, slice, int, slice)
        ``(local stack, local slots, full stack, full slots)``: slots
        ``local slots`` of the rank's stack ``local stack`` are slots
        ``full slots`` of the single-process stack ``full stack``.
    """
    local, owned = local_plan(plan, split, rank)
    out = []
    for lgroup, (g, start, stop) in zip(local.groups, owned):
        full = plan.groups[g]
        for (ls, lf), (fs, ff) in zip(lgroup.factor_slots, full.factor_slots):
            out.append((ls, slice(lf, lf + stop - start), fs, slice(ff + start, ff + stop)))
    return out


def _empty_stacks(specs, name: str, like) -> list:
    """CPU stacks for ``specs`` to copy the slots of ``name`` into, as a fresh state has
    them (zero factors, identity roots), packed if the saved stacks ``like`` are."""
    if name == "root_failures":
        return [torch.zeros((spec.count,), dtype=torch.int32) for spec in specs]
    present = [a for a in like if a is not None]
    if name == "factor_bounds":
        # Slots no rank filled never had a gradient: zero factors, bound 0 (exact).
        dtype = present[0].dtype if present else torch.float32
        return [torch.zeros((spec.count, 2), dtype=dtype) for spec in specs]
    if name == "roots" and not present:
        # Kept by no rank (keep_roots=False, or no gradient yet): the optimizer makes
        # them when it needs them.
        return [None] * len(specs)
    packed = bool(present) and present[0].ndim == 2
    dtype = present[0].dtype if present else None
    return [empty_stack(spec, torch, "cpu", packed=packed,
                        root_dtype=dtype)[0 if name == "factors" else 1] for spec in specs]


def _stack_names(entry: dict) -> tuple:
    """The per-stack arrays of a family's entry (carried bounds only where saved)."""
    return ("factors", "roots", "root_failures") + (
        ("factor_bounds",) if "factor_bounds" in entry else ())


def _family_entries(state_dict) -> list:
    families = state_dict.get("shampoo_families")
    if families is None:
        raise ValueError("not a matroot Shampoo state dict (no 'shampoo_families')")
    return families


def consolidate_state_dicts(state_dicts) -> dict:
    """One single-process state dict from the state dicts of every rank of a sharded run.

    Load the result into a :class:`matroot.optim.Shampoo` built with
    ``distributed=None`` over the same parameters (or shard it again for any
    world size with :func:`shard_state_dict`).

    Parameters
    ----------
    state_dicts : sequence of dict
        ``optimizer.state_dict()`` of every rank, in any order (one per rank).

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        If ranks are missing or repeated, or the dicts come from different runs.
    """
    state_dicts = list(state_dicts)
    if not state_dicts:
        raise ValueError("no state dicts given")
    first = state_dicts[0]
    out = {k: v for k, v in first.items() if k != "shampoo_families"}
    out["state"] = dict(first.get("state", {}))
    families = []
    for f, entry in enumerate(_family_entries(first)):
        shard = entry.get("shard")
        if shard is None:
            families.append(dict(entry))
            continue
        world = int(shard["world_size"])
        by_rank: dict[int, dict] = {}
        dicts: dict[int, dict] = {}
        for sd in state_dicts:
            e = _family_entries(sd)[f]
            if e.get("shard") is None or e["shard"]["split"] != shard["split"] \
                    or e["params"] != entry["params"]:
                raise ValueError(f"family {f}: the state dicts come from different runs")
            by_rank.setdefault(int(e["shard"]["rank"]), e)
            dicts.setdefault(int(e["shard"]["rank"]), sd)
        if sorted(by_rank) != list(range(world)) or len(state_dicts) != world:
            raise ValueError(f"family {f}: need one state dict from each of {world} ranks, "
                             f"got ranks {sorted(by_rank)} in {len(state_dicts)} dicts")
        plan = _plan_of_family(first, entry)
        split = ShardPlan.from_dict(shard["split"])
        names = _stack_names(entry)
        merged = {k: v for k, v in entry.items() if k not in ("shard", *names)}
        merged["root_refreshes"] = max(int(e["root_refreshes"]) for e in by_rank.values())
        for name in names:
            stacks = _empty_stacks(plan.stacks, name,
                                   [a for e in by_rank.values() for a in e[name]])
            for rank, e in by_rank.items():
                for ls, lslots, fs, fslots in slot_map(plan, split, rank):
                    if e[name][ls] is not None:     # None: never had a gradient (lazy)
                        stacks[fs][fslots] = e[name][ls][lslots].cpu()
            merged[name] = stacks
        out["state"].update(_merge_param_state(entry["params"], plan, split, dicts))
        families.append(merged)
    out["shampoo_families"] = families
    return out


def _merge_param_state(numbers, plan: BlockPlan, split: ShardPlan, dicts: dict) -> dict:
    """One family's per-parameter state from every rank's state dict.

    Moments come from any rank that keeps them (every such rank computed them from the
    same gradients); a momentum buffer follows its parameter's updates, right on each
    block's owner only, so it is put together block by block.
    """
    merged: dict = {}
    for rank, sd in sorted(dicts.items()):
        local, owned = local_plan(plan, split, rank)
        for i, number in enumerate(numbers):
            entry = sd.get("state", {}).get(number)
            if entry is None or i in local.remote_params:
                continue
            if number not in merged:
                merged[number] = {k: (v.clone() if torch.is_tensor(v) else v)
                                  for k, v in entry.items()}
            if "momentum_buffer" in entry and plan.params[i].kind != ELEMENTWISE:
                target = merged[number]["momentum_buffer"].view(plan.params[i].view)
                source = entry["momentum_buffer"].view(plan.params[i].view)
                for g, start, stop in owned:
                    for block in plan.groups[g].blocks[start:stop]:
                        if block.param == i:
                            target[block.index] = source[block.index]
    return merged


def shard_state_dict(state_dict: dict, world_size: int, rank: int) -> dict:
    """The state dict rank ``rank`` of a ``world_size`` run loads, from a single-process one.

    With :func:`consolidate_state_dicts` this moves a run to another world size.

    Parameters
    ----------
    state_dict : dict
        A single-process (or consolidated) :class:`~matroot.optim.Shampoo` state dict.
    world_size, rank : int

    Returns
    -------
    dict
    """
    out = {k: v for k, v in state_dict.items() if k != "shampoo_families"}
    out["state"] = dict(state_dict.get("state", {}))
    families = []
    for entry in _family_entries(state_dict):
        if entry.get("shard") is not None:
            raise ValueError("this state dict is already sharded; consolidate it first")
        if world_size == 1:
            families.append(dict(entry))
            continue
        plan = _plan_of_family(state_dict, entry)
        split = shard_plan(plan, world_size)
        local, _ = local_plan(plan, split, rank)
        for i in local.remote_params:          # moments this rank does not keep
            out["state"].pop(entry["params"][i], None)
        names = _stack_names(entry)
        sharded = {k: v for k, v in entry.items() if k not in names}
        for name in names:
            stacks = _empty_stacks(local.stacks, name, entry[name])
            for ls, lslots, fs, fslots in slot_map(plan, split, rank):
                if entry[name][fs] is not None:
                    stacks[ls][lslots] = entry[name][fs][fslots].cpu()
            sharded[name] = stacks
        sharded["shard"] = {"world_size": world_size, "rank": rank, "split": split.to_dict()}
        families.append(sharded)
    out["shampoo_families"] = families
    return out
