"""Shampoo's state in ``torch.distributed.checkpoint`` (DCP) checkpoints, for any world size.

Shampoo's sharded state is not laid out like FSDP2's parameters (a rank holds the
factor stacks of its own blocks, whose split depends on the world size), so it
does not go through ``get_optimizer_state_dict``. Instead each rank puts its own
:meth:`~matroot.optim.Shampoo.state_dict` into the checkpoint, serialised under a
key of its own (:func:`dcp_state_dict`), next to the model's state in the same
``dcp.save``. :func:`load_dcp_state_dict` reads every saved rank's entry back,
merges them into the single-process state (:func:`~matroot.optim.distributed.core.
consolidate_state_dicts`) and gives the loading optimizer its part for its own
world size (:func:`~matroot.optim.distributed.core.shard_state_dict`), so a run saved
at 2 ranks resumes at 3 or in one process with the updates it would have made.

Example (every rank)::

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from matroot.optim.distributed.checkpoint import dcp_state_dict, load_dcp_state_dict

    dcp.save({"model": get_model_state_dict(model), "optim": dcp_state_dict(opt)},
             checkpoint_id="ckpt/step100")
    ...  # later, at any world size, after building the model and the optimizer:
    dcp.load({"model": ...}, checkpoint_id="ckpt/step100")   # as usual for the model
    load_dcp_state_dict(opt, "ckpt/step100")
"""

from __future__ import annotations

import io
import re

import torch
import torch.distributed as dist

from .core import consolidate_state_dicts, shard_state_dict

__all__ = ["dcp_state_dict", "load_dcp_state_dict", "saved_state_dicts"]

_ENTRY = re.compile(r"rank(\d+)_of_(\d+)$")


def _rank_and_world(optimizer) -> tuple[int, int]:
    group = optimizer._process_group
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def dcp_state_dict(optimizer) -> dict:
    """This rank's entry of a DCP checkpoint: ``{"rank<r>_of_<world>": bytes}``.

    Put it under a key of the dict given to ``torch.distributed.checkpoint.save``
    (``"optim"`` is what :func:`load_dcp_state_dict` looks for by default); every
    rank's entry has its own name, so DCP keeps all of them.

    Parameters
    ----------
    optimizer : matroot.optim.Shampoo

    Returns
    -------
    dict
    """
    rank, world = _rank_and_world(optimizer)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    return {f"rank{rank}_of_{world}": buffer.getvalue()}


def _saved_entries(checkpoint_id, key: str, what: str = "Shampoo") -> tuple[list[str], int]:
    """Names of the saved ranks' entries under ``key`` and the world size they form
    (``what``: the optimizer the messages name)."""
    import torch.distributed.checkpoint as dcp

    try:
        metadata = dcp.FileSystemReader(checkpoint_id).read_metadata()
    except (OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"cannot read the checkpoint metadata of {checkpoint_id!r}: "
                         f"{err}") from err
    found = {}
    for fqn in metadata.state_dict_metadata:
        prefix, _, name = fqn.rpartition(".")
        match = _ENTRY.match(name)
        if prefix == key and match:
            found[name] = (int(match.group(1)), int(match.group(2)))
    if not found:
        raise ValueError(
            f"checkpoint {checkpoint_id!r} holds no {what} state under {key!r}: save it "
            f"with dcp.save({{{key!r}: dcp_state_dict(optimizer), ...}}) (keys found: "
            f"{sorted(metadata.state_dict_metadata)[:8]})")
    worlds = {world for _, world in found.values()}
    ranks = sorted(rank for rank, _ in found.values())
    if len(worlds) != 1 or ranks != list(range(next(iter(worlds)))):
        raise ValueError(f"checkpoint {checkpoint_id!r} is incomplete or mixed: {what} "
                         f"entries {sorted(found)} do not form one run's ranks")
    return sorted(found, key=lambda n: found[n][0]), next(iter(worlds))


def saved_state_dicts(checkpoint_id, key: str, what: str = "Shampoo") -> list[dict]:
    """Every saved rank's state dict under ``key`` of a DCP checkpoint, in rank order
    (a collective when ``torch.distributed`` runs; ``what``: the optimizer the
    messages name)."""
    import torch.distributed.checkpoint as dcp

    names, _ = _saved_entries(checkpoint_id, key, what)
    holder: dict = {key: dict.fromkeys(names)}
    dcp.load(holder, checkpoint_id=checkpoint_id)
    shards = []
    for name in names:
        try:
            shards.append(torch.load(io.BytesIO(holder[key][name]), weights_only=True))
        except Exception as err:
            raise ValueError(f"checkpoint {checkpoint_id!r}: the {what} state {name} cannot "
                             f"be read ({type(err).__name__}: {err})") from err
    return shards


def load_dcp_state_dict(optimizer, checkpoint_id, *, key: str = "optim") -> None:
    """Load a DCP checkpoint's Shampoo state into ``optimizer``, whatever world size saved it.

    A collective when ``torch.distributed`` is initialised: every rank calls it. Each
    rank reads every saved rank's entry (the single-process state, transiently) and
    keeps its own part.

    Parameters
    ----------
    optimizer : matroot.optim.Shampoo
        Built over the same parameters, in the same order, as the saved one.
    checkpoint_id : str or os.PathLike
        The directory given to ``dcp.save``.
    key : str
        The key the entries were saved under.

    Raises
    ------
    ValueError
        If the checkpoint has no Shampoo entries under ``key``, some ranks' entries
        are missing or unreadable, or the state does not fit the optimizer's
        parameters (then naming what differs).
    """
    shards = saved_state_dicts(checkpoint_id, key)
    merged = consolidate_state_dicts(shards) if len(shards) > 1 else shards[0]
    rank, world = _rank_and_world(optimizer)
    optimizer.load_state_dict(merged if world == 1 else shard_state_dict(merged, world, rank))
