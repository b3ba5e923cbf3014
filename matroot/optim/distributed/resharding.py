"""Shampoo state dicts across world sizes: each rank's shard, one merged state, and back.

A sharded rank's state dict holds the factor stacks of its own blocks
(:class:`~matroot.optim.distributed.core.BlockSharding`). :func:`consolidate_state_dicts`
merges every rank's into the single-process state dict, :func:`shard_state_dict`
cuts one for any rank of any world size (:func:`slot_map` says where each rank's
slots sit), and :func:`check_shard` refuses a shard loaded where it does not fit.
DCP checkpoints (:mod:`matroot.optim.distributed.checkpoint`) go through both.
"""

from __future__ import annotations

import math

import torch

from ..shampoo_core.blocking import ELEMENTWISE, BlockPlan, FactorPolicy, plan_blocks
from ..shampoo_core.checkpoint import plan_from_layout
from ..shampoo_core.preconditioner import empty_stack
from .rank_part import MOMENT_KEYS, Piece, local_plan, own_part, place_part, rank_pieces
from .sharding import ShardPlan, shard_plan

__all__ = ["check_shard", "slot_map", "consolidate_state_dicts", "shard_state_dict"]


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
            "matroot.optim.distributed.core.shard_state_dict(state_dict, world_size, rank)")
    if sharding is None:
        raise ValueError(
            f"this state dict is rank {saved['rank']}'s shard of a {saved['world_size']}-rank "
            "run; merge every rank's with matroot.optim.distributed.core.consolidate_state_dicts "
            "to load it without torch.distributed")
    if int(saved["world_size"]) != sharding.world_size or int(saved["rank"]) != sharding.rank:
        raise ValueError(
            f"this state dict is rank {saved['rank']}'s shard of a {saved['world_size']}-rank "
            f"run, loaded on rank {sharding.rank} of {sharding.world_size}; use "
            "consolidate_state_dicts and shard_state_dict to change the world size")
    # Splits saved before elementwise parameters had one owner name none: the blocks decide.
    if ShardPlan.from_dict(saved["split"]).counts != sharding.split.counts:
        raise ValueError("the state dict was saved under a different split of the blocks "
                         "(other parameters or block_size, or an older matroot's split?); "
                         "merge every rank's state dict with consolidate_state_dicts and "
                         "load shard_state_dict(merged, world_size, rank)")


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
                       # The first format predates the factor-ratio rule.
                       policy=FactorPolicy(precondition_1d=bool(config["precondition_1d"]),
                                           max_factor_ratio=math.inf),
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


def _empty_stacks(stack_shapes, name: str, like) -> list:
    """CPU stacks for ``stack_shapes`` to copy the slots of ``name`` into, as a fresh state has
    them (zero factors, identity roots), packed if the saved stacks ``like`` are."""
    if name == "root_failures":
        return [torch.zeros((s.count,), dtype=torch.int32) for s in stack_shapes]
    present = [a for a in like if a is not None]
    if name == "factor_bounds":
        # Slots no rank filled never had a gradient: zero factors, bound 0 (exact).
        dtype = present[0].dtype if present else torch.float32
        return [torch.zeros((s.count, 2), dtype=dtype) for s in stack_shapes]
    if name == "roots" and not present:
        # Kept by no rank (keep_roots=False, or no gradient yet): the optimizer makes
        # them when it needs them.
        return [None] * len(stack_shapes)
    packed = bool(present) and present[0].ndim == 2
    dtype = present[0].dtype if present else None
    return [empty_stack(s, torch, "cpu", packed=packed,
                        root_dtype=dtype)[0 if name == "factors" else 1] for s in stack_shapes]


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

    Each rank's moments are written at the places of its pieces (those it keeps of
    a parameter cut between ranks are flat). State dicts saved before a rank kept only
    its own elements hold whole-parameter moments, right on the rank's blocks (a
    momentum buffer follows its parameter's updates, right on each block's owner only),
    and every rank's copy of an elementwise parameter's: any one is right.
    """
    merged: dict = {}
    for rank, sd in sorted(dicts.items()):
        pieces = rank_pieces(plan, split, rank)
        for i, number in enumerate(numbers):
            entry = sd.get("state", {}).get(number)
            layout = plan.params[i]
            mine = [piece for piece in pieces if piece.param == i]
            if layout.kind == ELEMENTWISE:    # from its owner, or the first of the ranks
                mine = [] if number in merged else [Piece(i, None, layout.shape, 0)]
            if entry is None or not mine:
                continue
            out = merged.setdefault(number, {})
            for key, value in entry.items():
                if key not in MOMENT_KEYS:
                    out.setdefault(key, value.clone() if torch.is_tensor(value) else value)
                    continue
                if key not in out:
                    out[key] = torch.zeros(layout.shape, dtype=value.dtype)
                place_part(out[key], value.cpu(), mine, layout)
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
        pieces = rank_pieces(plan, split, rank)
        for i, number in enumerate(entry["params"]):
            kept = out["state"].pop(number, None)
            mine = [piece for piece in pieces if piece.param == i]
            if kept is not None and mine:
                out["state"][number] = {
                    key: own_part(value, mine, plan.params[i]) if key in MOMENT_KEYS
                    else value for key, value in kept.items()}
        names = _stack_names(entry)
        sharded = {k: v for k, v in entry.items() if k not in names}
        for name in names:
            stacks = _empty_stacks(local_plan(plan, split, rank)[0].stacks, name, entry[name])
            for ls, lslots, fs, fslots in slot_map(plan, split, rank):
                if entry[name][fs] is not None:
                    stacks[ls][lslots] = entry[name][fs][fslots].cpu()
            sharded[name] = stacks
        sharded["shard"] = {"world_size": world_size, "rank": rank, "split": split.to_dict()}
        families.append(sharded)
    out["shampoo_families"] = families
    return out
