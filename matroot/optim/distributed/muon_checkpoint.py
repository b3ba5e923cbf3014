"""Muon's state in ``torch.distributed.checkpoint`` (DCP) checkpoints, for any world size.

A sharded :class:`~matroot.optim.Muon` keeps every state tensor as a ``DTensor`` of
its parameter's shape holding this rank's part (rows, columns, or all of it on one
rank: :mod:`matroot.optim.distributed.muon_layout`), one process keeps plain
tensors; DCP saves either as the whole tensor and loads it into whichever layout
the loading optimizer has, so a run saved at 2 ranks resumes at 3, or in one
process, with the same state. :func:`muon_dcp_state_dict` names each parameter's entries by its
position in the optimizer's groups.

Example (every rank)::

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from matroot.optim.distributed.muon_checkpoint import (muon_dcp_state_dict,
                                                           load_muon_dcp_state_dict)

    dcp.save({"model": get_model_state_dict(model), "optim": muon_dcp_state_dict(opt)},
             checkpoint_id="ckpt/step100")
    ...  # later, at any world size, after building the model and the optimizer:
    load_muon_dcp_state_dict(opt, "ckpt/step100")
"""

from __future__ import annotations

import torch

__all__ = ["muon_dcp_state_dict", "load_muon_dcp_state_dict"]

_TENSORS = ("momentum_buffer", "exp_avg_sq")


def _params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def muon_dcp_state_dict(optimizer) -> dict:
    """The optimizer's state for ``dcp.save``: ``{"<position>": {"momentum_buffer": ...,
    "exp_avg_sq": ... (AdamW's), "step": 0-d int64 tensor}}`` for every parameter with
    state. Its tensors are the optimizer's own (no copy).

    Parameters
    ----------
    optimizer : matroot.optim.Muon

    Returns
    -------
    dict

    Examples
    --------
    >>> import torch
    >>> from matroot.optim import Muon
    >>> from matroot.optim.distributed.muon_checkpoint import muon_dcp_state_dict
    >>> w = torch.nn.Parameter(torch.ones(4, 3))
    >>> opt = Muon([("layer.weight", w)], distributed=None)
    >>> w.grad = torch.ones(4, 3)
    >>> opt.step()
    >>> {k: sorted(v) for k, v in muon_dcp_state_dict(opt).items()}
    {'0': ['momentum_buffer', 'step']}
    """
    out = {}
    for k, p in enumerate(_params(optimizer)):
        state = optimizer.state.get(p)
        if state:
            entry = {key: state[key] for key in _TENSORS if key in state}
            entry["step"] = torch.tensor(int(state.get("step", 0)), dtype=torch.int64)
            out[str(k)] = entry
    return out


def load_muon_dcp_state_dict(optimizer, checkpoint_id, *, key: str = "optim") -> None:
    """Load the Muon state of a DCP checkpoint into ``optimizer``, whatever world size
    saved it (a collective when ``torch.distributed`` runs: every rank calls it).

    Parameters
    ----------
    optimizer : matroot.optim.Muon
        Built over the same parameters, in the same order, as the saved one.
    checkpoint_id : str or os.PathLike
        The directory given to ``dcp.save``.
    key : str
        The key :func:`muon_dcp_state_dict`'s entries were saved under.

    Raises
    ------
    ValueError
        If the checkpoint has no Muon state under ``key``, or names a parameter
        position this optimizer does not have.

    Examples
    --------
    >>> import tempfile, warnings
    >>> import torch, torch.distributed.checkpoint as dcp
    >>> from matroot.optim import Muon
    >>> from matroot.optim.distributed.muon_checkpoint import (
    ...     load_muon_dcp_state_dict, muon_dcp_state_dict)
    >>> w = torch.nn.Parameter(torch.ones(4, 3))
    >>> opt = Muon([("layer.weight", w)], distributed=None)
    >>> w.grad = torch.ones(4, 3)
    >>> opt.step()
    >>> path = tempfile.mkdtemp()
    >>> with warnings.catch_warnings():   # DCP says it runs without a process group
    ...     warnings.simplefilter("ignore")
    ...     _ = dcp.save({"optim": muon_dcp_state_dict(opt)}, checkpoint_id=path)
    ...     fresh = Muon([("layer.weight", w)], distributed=None)
    ...     load_muon_dcp_state_dict(fresh, path)
    >>> fresh.state[w]["step"], torch.equal(fresh.state[w]["momentum_buffer"],
    ...                                     opt.state[w]["momentum_buffer"])
    (1, True)
    """
    import torch.distributed.checkpoint as dcp

    try:
        names = dcp.FileSystemReader(checkpoint_id).read_metadata().state_dict_metadata
    except (OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"cannot read the checkpoint metadata of {checkpoint_id!r}: "
                         f"{err}") from err
    saved: dict[int, list[str]] = {}
    for fqn in names:
        parts = fqn.split(".")
        if len(parts) == 3 and parts[0] == key and parts[1].isdigit():
            saved.setdefault(int(parts[1]), []).append(parts[2])
    if not saved:
        raise ValueError(f"checkpoint {checkpoint_id!r} holds no Muon state under {key!r}: "
                         f"save it with dcp.save({{{key!r}: muon_dcp_state_dict(optimizer), "
                         "...}})")
    params = _params(optimizer)
    if max(saved) >= len(params):
        raise ValueError(f"checkpoint {checkpoint_id!r} holds state of parameter {max(saved)} "
                         f"but the optimizer has {len(params)}: load it into the model and "
                         "optimizer it was saved from")
    optimizer._make_states([params[k] for k in sorted(saved)])
    template = {}
    for k in sorted(saved):
        state = optimizer.state[params[k]]
        template[str(k)] = {name: state[name] if name in _TENSORS else
                            torch.zeros((), dtype=torch.int64) for name in saved[k]}
    holder = {key: template}
    dcp.load(holder, checkpoint_id=checkpoint_id)
    for number, entry in holder[key].items():
        state = optimizer.state[params[int(number)]]
        for name, value in entry.items():
            if name == "step":
                state["step"] = int(value)
            elif value is not state[name]:     # DCP loads in place; copy if it did not
                state[name].copy_(value)
