"""How :class:`matroot.optim.Muon` turns torch-style ``params`` (tensors, ``(name, tensor)``
pairs or group dicts) into groups that each say ``use_muon``: groups without it are split
by :func:`~matroot.optim.muon.core.default_use_muon`, and their keys read as the
constructor reads its keywords."""

from __future__ import annotations

import torch

from ..muon.core import default_use_muon, is_unnamed, unnamed_matrices_warning
from .param_lists import listed_once

__all__ = ["consistent_names", "split_groups"]


#: Keys of a group without ``use_muon`` that set its AdamW part's value of a key.
_ADAMW_KEYS = {"adamw_lr": "lr", "adamw_weight_decay": "weight_decay"}


def _members(params) -> list:
    """A group's ``params`` as a list of tensors or ``(name, tensor)`` pairs, refused as
    torch's optimizers refuse them: a set (its order, which a state dict's numbering
    follows, changes between runs) and anything that is not a tensor."""
    if isinstance(params, torch.Tensor):
        # One tensor, as torch's optimizers allow (iterating it would give its rows).
        return [params]
    if isinstance(params, set):
        raise TypeError("optimizer parameters need to be organized in ordered collections, "
                        "but the ordering of tensors in sets will change between runs. "
                        "Please use a list instead.")
    members = listed_once(params, "Muon")
    for p in members:
        tensor = p[1] if isinstance(p, tuple) and len(p) == 2 else p
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"Muon optimizes tensors or (name, tensor) pairs, but one of the params "
                f"is {torch.typename(p)}: pass model.parameters() or "
                "model.named_parameters() (a dict iterates its names)")
    return members


def split_groups(params, lr, weight_decay, adamw_lr, adamw_weight_decay) -> list[dict]:
    """torch-style ``params`` (tensors, (name, tensor) pairs or group dicts) as groups
    that each say ``use_muon``."""
    if isinstance(params, torch.Tensor):
        raise TypeError("params argument given to Muon should be an iterable of Tensors "
                        f"or dicts, but got a single {torch.typename(params)}: pass [tensor]")
    entries = list(params)
    if not entries:
        raise ValueError("Muon got an empty parameter list")
    if not isinstance(entries[0], dict):
        entries = [{"params": entries}]
    groups, unnamed = [], []
    for entry in entries:
        options = {k: v for k, v in entry.items() if k != "params"}
        members = _members(entry["params"])
        if any(isinstance(p[1] if isinstance(p, tuple) else p,
                          torch.nn.parameter.UninitializedParameter) for p in members):
            raise ValueError("Muon splits parameters by shape when it is made: run one "
                             "forward pass to initialise lazy modules (LazyLinear, ...) "
                             "before making the optimizer")
        adamw_options = {_ADAMW_KEYS[k]: options.pop(k) for k in list(options)
                         if k in _ADAMW_KEYS}
        if "use_muon" in options:
            if adamw_options:
                raise ValueError(
                    f"a parameter group with 'use_muon' sets "
                    f"{', '.join(repr('adamw_' + k) for k in adamw_options)}, which only "
                    "a group split by the rule reads: set 'lr' and 'weight_decay' (in a "
                    "group with use_muon=False for AdamW's)")
            for p in members:
                name, tensor = p if isinstance(p, tuple) else (None, p)
                if options["use_muon"] and tensor.ndim < 2:
                    raise ValueError(
                        f"use_muon=True needs tensors of two or more dimensions, got "
                        f"{name or 'a parameter'} of shape {tuple(tensor.shape)}: put it "
                        "in a group with use_muon=False, or leave use_muon out to split "
                        "by the rule")
            # A half's lr and weight_decay default to the constructor's for that half:
            # adamw_lr for an AdamW group (torch's defaults would give it Muon's lr).
            half = (dict(lr=lr, weight_decay=weight_decay) if options["use_muon"]
                    else dict(lr=adamw_lr, weight_decay=adamw_weight_decay))
            groups.append({"params": members, **half, **options})
            continue
        split: dict[bool, list] = {True: [], False: []}
        adamw_names = []
        for p in members:
            name, tensor = p if isinstance(p, tuple) else (None, p)
            muon = default_use_muon(name, tensor.shape)
            split[muon].append(p)       # a (name, tensor) pair keeps its name, as torch does
            if muon and is_unnamed(name):
                unnamed.append(tuple(tensor.shape))
            if not muon:
                adamw_names.append(f"{name or 'a parameter'} of shape {tuple(tensor.shape)}")
        _check_unambiguous(options, adamw_options, adamw_names)
        for muon, tensors in split.items():
            if tensors:
                defaults = (dict(lr=lr, weight_decay=weight_decay) if muon
                            else dict(lr=adamw_lr, weight_decay=adamw_weight_decay))
                own = {} if muon else adamw_options
                groups.append({"params": tensors, **defaults, **options, **own,
                               "use_muon": muon})
    unnamed_matrices_warning(
        unnamed, "Muon", "Pass model.named_parameters() so that the rule recognises "
        "embeddings and heads by name, or groups with use_muon=True/False.")
    return groups


def _check_unambiguous(options, adamw_options, adamw_names) -> None:
    """Refuse a group without ``use_muon`` whose ``lr`` or ``weight_decay`` would be read
    as Muon's while the rule sends some of its parameters to AdamW (a script written
    for AdamW's or torch.optim.Muon's groups means them for every parameter)."""
    unmatched = [k for k in ("lr", "weight_decay") if k in options and k not in adamw_options]
    if unmatched and adamw_names:
        key = unmatched[0]
        raise ValueError(
            f"a parameter group without 'use_muon' sets {key!r}, which is Muon's (as the "
            f"constructor's {key} is), but the rule sends {len(adamw_names)} of its "
            f"parameters to AdamW ({adamw_names[0]}, ...): set 'adamw_{key}' in the group "
            "too, or give groups with use_muon=True and use_muon=False")


def consistent_names(group: dict, param_groups: list[dict]) -> dict:
    """``group`` ready for torch's ``add_param_group`` beside ``param_groups``: its
    ``(name, tensor)`` pairs kept (torch then keeps the names in ``param_names``) only
    where it and every group before it are named throughout; otherwise every group
    goes without names.

    torch refuses a group without names beside groups with them (and the reverse),
    which for its own optimizers is the caller's mistake; here the rule has read the
    names already, and unfreezing a layer by ``add_param_group({"params":
    layer.parameters()})`` after ``Muon(model.named_parameters())`` must keep working.

    Examples
    --------
    >>> import torch
    >>> w = torch.zeros(2, 2)
    >>> groups = [{"params": [w], "param_names": ["w"]}]
    >>> consistent_names({"params": [w]}, groups)["params"][0] is w, groups[0].keys()
    (True, dict_keys(['params']))
    """
    params = list(group["params"])
    if params and all(isinstance(p, tuple) for p in params) and \
            all("param_names" in g for g in param_groups):
        return group
    for other in param_groups:
        other.pop("param_names", None)
    return {**group, "params": [p[1] if isinstance(p, tuple) else p for p in params]}
