"""SOAP's state across world sizes, and in ``torch.distributed.checkpoint`` (DCP) checkpoints.

A sharded :class:`~matroot.optim.SOAP` rank keeps the factors, eigenbases and block
moments (SOAP's, and the grafting direction's when it has any) of its own run of every
group's blocks and the moments of the unfactored parameters it owns
(:mod:`matroot.optim.torch.soap_sharding`), a split that depends on the world size.
:func:`merge_family` puts every rank's arrays back where they sit in the
single-process state, :func:`cut_family` takes one rank's out of it for any world size.
:class:`~matroot.optim.SOAP`'s ``load_state_dict`` cuts a single-process state dict
itself, so a merged one loads at any world size.

In a DCP checkpoint each rank's ``state_dict()`` is one entry, as for Shampoo
(:func:`~matroot.optim.distributed.checkpoint.dcp_state_dict`);
:func:`load_soap_dcp_state_dict` reads every saved rank's, merges them and loads the
result, so a run saved at 2 ranks resumes at 3, or in one process, with the same
trajectory.

Example (every rank)::

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from matroot.optim.distributed.checkpoint import dcp_state_dict
    from matroot.optim.distributed.soap_checkpoint import load_soap_dcp_state_dict

    dcp.save({"model": get_model_state_dict(model), "optim": dcp_state_dict(opt)},
             checkpoint_id="ckpt/step100")
    ...  # later, at any world size, after building the model and the optimizer:
    load_soap_dcp_state_dict(opt, "ckpt/step100")
"""

from __future__ import annotations


import torch

from ..shampoo_core.blocking import BlockPlan
from .checkpoint import saved_state_dicts
from .rank_part import local_plan
from .resharding import slot_map
from .sharding import shard_plan

__all__ = ["merge_family", "cut_family", "merge_state_dicts", "load_soap_dcp_state_dict"]

_BLOCK_ARRAYS = ("block_exp_avg", "block_exp_avg_sq", "block_graft_exp_avg",
                 "block_graft_exp_avg_sq")
_STACK_ARRAYS = ("factors", "bases", "residuals")
_PARAM_ARRAYS = ("exp_avg", "exp_avg_sq", "graft_exp_avg", "graft_exp_avg_sq")
#: Arrays a record holds only with a grafting that keeps moments (None entries, or no
#: key in a record saved before grafting existed, without).
_GRAFTING = ("block_graft_exp_avg", "block_graft_exp_avg_sq", "graft_exp_avg",
             "graft_exp_avg_sq")


def _dtype(name: str):
    return getattr(torch, name)


def _arrays(entry: dict, name: str, count: int) -> list:
    """``entry[name]``; for a grafting array a record lacks, ``count`` Nones."""
    return entry.get(name, [None] * count) if name in _GRAFTING else entry[name]


def _kept(entries, name: str) -> bool:
    """Whether the records hold the grafting array ``name`` (any rank's, not None)."""
    return any(a is not None for e in entries for a in e.get(name) or ())


def _fresh_full(plan: BlockPlan, name: str, kept: bool = True) -> list:
    """Single-process CPU arrays of ``name`` as :func:`matroot.optim.soap.init` makes them
    (Nones for a grafting array not ``kept``)."""
    if name in _BLOCK_ARRAYS:
        return [torch.zeros((len(g.blocks), *g.shape), dtype=_dtype(g.dtype))
                if kept else None for g in plan.groups]
    if name == "bases":
        return [torch.eye(s.size, dtype=_dtype(s.dtype)).repeat(s.count, 1, 1)
                for s in plan.stacks]
    if name == "residuals":
        return [torch.zeros((s.count,), dtype=_dtype(s.dtype)) for s in plan.stacks]
    return [torch.zeros((s.count, s.size, s.size), dtype=_dtype(s.dtype)) for s in plan.stacks]


def _check_fits(arrays, expected, name: str, where: str) -> None:
    if len(arrays) != len(expected) or any(
            (a is None) != (b is None) or (b is not None and tuple(a.shape) != tuple(b.shape))
            for a, b in zip(arrays, expected)):
        raise ValueError(f"{where}: the SOAP {name!r} does not fit the parameters' split "
                         "(another model, or other block settings?)")


def merge_family(entries, plan: BlockPlan) -> dict:
    """One family's single-process record from every rank's record of it.

    Parameters
    ----------
    entries : sequence of dict
        The family's entry of ``state_dict()["soap_families"]`` of every rank, in rank
        order (their ``"shard"`` is ``[world, rank]``).
    plan : BlockPlan
        The family's whole plan (:func:`matroot.optim.soap.make_plan` of its parameters).

    Returns
    -------
    dict
        The record a single-process optimizer saves (``"shard"`` None).

    Raises
    ------
    ValueError
        If ranks are missing, or a rank's arrays do not fit its share of ``plan``.
    """
    world = len(entries)
    if [tuple(e["shard"] or ()) for e in entries] != [(world, r) for r in range(world)]:
        raise ValueError(f"need the SOAP records of ranks 0..{world - 1} of one run, got "
                         f"{[e['shard'] for e in entries]}")
    split = shard_plan(plan, world)
    out = {k: v for k, v in entries[0].items() if k not in (*_BLOCK_ARRAYS, *_STACK_ARRAYS)}
    out.update(shard=None, refreshes=max(int(e["refreshes"]) for e in entries),
               param_steps=[max(int(e["param_steps"][i]) for e in entries)
                            for i in range(len(plan.params))])
    kept = {name: name not in _GRAFTING or _kept(entries, name) for name in _BLOCK_ARRAYS}
    full = {name: _fresh_full(plan, name, kept.get(name, True))
            for name in (*_BLOCK_ARRAYS, *_STACK_ARRAYS)}
    count = len(plan.params)
    for name in _PARAM_ARRAYS:
        out[name] = [next((a[i].cpu() for a in (_arrays(e, name, count) for e in entries)
                           if a[i] is not None), None) for i in range(count)]
    for rank, entry in enumerate(entries):
        local, owned = local_plan(plan, split, rank)
        for name in _BLOCK_ARRAYS:
            parts = _arrays(entry, name, len(local.groups))
            _check_fits(parts, _fresh_full(local, name, kept[name]), name, f"rank {rank}")
            if not kept[name]:
                continue
            for part, (g, start, stop) in zip(parts, owned):
                full[name][g][start:stop] = part.cpu()
        for name in _STACK_ARRAYS:
            _check_fits(entry[name], _fresh_full(local, name), name, f"rank {rank}")
            for ls, lslots, fs, fslots in slot_map(plan, split, rank):
                full[name][fs][fslots] = entry[name][ls][lslots].cpu()
    out.update(full)
    return out


def cut_family(entry: dict, plan: BlockPlan, world: int, rank: int) -> dict:
    """Rank ``rank``'s record of a ``world``-rank run from a single-process ``entry``.

    Parameters
    ----------
    entry : dict
        A single-process (or :func:`merge_family`) record.
    plan : BlockPlan
        The family's whole plan.
    world, rank : int

    Returns
    -------
    dict
    """
    split = shard_plan(plan, world)
    local, owned = local_plan(plan, split, rank)
    mine = set(split.elementwise_of(rank))
    out = dict(entry, shard=[world, rank])
    for name in _PARAM_ARRAYS:
        out[name] = [a if i in mine else None
                     for i, a in enumerate(_arrays(entry, name, len(plan.params)))]
    for name in _BLOCK_ARRAYS:
        whole = _arrays(entry, name, len(plan.groups))
        out[name] = [None if whole[g] is None else whole[g][start:stop].clone()
                     for g, start, stop in owned]
    for name in _STACK_ARRAYS:
        stacks = _fresh_full(local, name)
        for ls, lslots, fs, fslots in slot_map(plan, split, rank):
            stacks[ls][lslots] = entry[name][fs][fslots]
        out[name] = stacks
    return out


def merge_state_dicts(state_dicts, plans) -> dict:
    """One single-process SOAP state dict from every rank's (``plans``: each family's
    whole plan, in the order of ``soap_families``)."""
    state_dicts = list(state_dicts)
    first = state_dicts[0]
    merged = dict(first)
    merged["soap_families"] = [
        entry if entry["shard"] is None else
        merge_family(sorted((sd["soap_families"][f] for sd in state_dicts),
                            key=lambda e: e["shard"][1]), plan)
        for f, (entry, plan) in enumerate(zip(first["soap_families"], plans))]
    return merged


def load_soap_dcp_state_dict(optimizer, checkpoint_id, *, key: str = "optim") -> None:
    """Load a DCP checkpoint's SOAP state into ``optimizer``, whatever world size saved it.

    A collective when ``torch.distributed`` runs: every rank calls it. Each rank reads
    every saved rank's entry (the single-process state, transiently) and keeps its part.

    Parameters
    ----------
    optimizer : matroot.optim.SOAP
        Built over the same parameters, in the same order, as the saved one.
    checkpoint_id : str or os.PathLike
        The directory given to ``dcp.save``.
    key : str
        The key :func:`~matroot.optim.distributed.checkpoint.dcp_state_dict`'s entries
        were saved under.

    Raises
    ------
    ValueError
        If the checkpoint has no SOAP entries under ``key``, some ranks' entries are
        missing or unreadable, or the state does not fit the optimizer's parameters.
    """
    shards = saved_state_dicts(checkpoint_id, key, what="SOAP")
    if any("soap_families" not in sd for sd in shards):
        raise ValueError(f"checkpoint {checkpoint_id!r} holds no SOAP state under {key!r} "
                         "(another optimizer's?)")
    plans = optimizer._saved_plans(shards[0])
    optimizer.load_state_dict(merge_state_dicts(shards, plans))
