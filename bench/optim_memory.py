"""Optimizer-state memory: bytes per parameter for AdamW, matroot's Shampoo policies and
Meta's Distributed Shampoo (when importable), on the same models and hyperparameters.

Each optimizer takes one step on random gradients, after which every array it will
ever hold exists (matroot allocates a stack's factors and roots together at its first
gradient; no root needs computing for that, so none is, except in the rows whose roots
are solved every step and not kept); the bytes are those of the tensors it keeps
between steps (moments, factors, inverse roots, counters), counted once per storage.

Distributed Shampoo has no package on PyPI, so the requirements cannot pin it; its
rows read "not installed" unless ``distributed_shampoo`` is importable. To measure it,
put a checkout of github.com/facebookresearch/optimizers on the path::

    git clone https://github.com/facebookresearch/optimizers /tmp/optimizers
    PYTHONPATH=/tmp/optimizers python -m bench optim --memory

(``pip install /tmp/optimizers`` installs it as ``torch-shampoo`` but asks for
Python ≥ 3.12; on the path it imports on Python 3.11 with torch 2.13 too).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import Any

#: A precondition_frequency past the one step taken: memory without solver time.
_NO_REFRESH = 10**9
#: Dimensions longer than this get no factor in the one-sided settings.
_ONE_SIDED_LIMIT = 4096

__all__ = ["MODELS", "POLICIES", "META_POLICIES", "MATCHED", "tensor_bytes", "memory_report",
           "format_memory_table"]

#: Parameter shapes of the models measured.
MODELS = {
    # A small character-level GPT: 4 layers, width 256, vocabulary 128, context 256.
    "char-gpt": [(128, 256), (256, 256)] + [
        shape for _ in range(4) for shape in
        [(256,), (256,), (768, 256), (768,), (256, 256), (256,), (256,), (256,),
         (1024, 256), (1024,), (256, 1024), (256,)]] + [(256,), (256,), (128, 256)],
    # A 50000×64 embedding (the case) under a small 64-wide network.
    "embedding-heavy": [(50000, 64), (256, 64), (256,), (64, 256), (64,), (64, 64)],
}

#: Every dimension gets its factor, as in Distributed Shampoo (the rows below other than
#: the defaults' compare like with like).
_EVERY_FACTOR = {"max_factor_ratio": math.inf}
_UNPACKED = {"symmetric_packing": False, **_EVERY_FACTOR}
_PACKED = {"symmetric_packing": True, **_EVERY_FACTOR}
_PACKED_BF16 = {**_PACKED, "root_storage_dtype": "bfloat16"}
_ONE_SIDED = {"max_preconditioned_dim": _ONE_SIDED_LIMIT}
#: Roots solved every step and not kept (Distributed Shampoo's default frequency).
_NOT_KEPT = {**_PACKED, "keep_roots": False, "precondition_frequency": 1}

#: matroot Shampoo settings measured, by name (ShampooConfig fields). "defaults" rows
#: change nothing but the root schedule; the others spell out every storage setting.
POLICIES: dict[str, dict[str, Any]] = {
    "shampoo, defaults (roots kept, frequency > 1)": {},
    "shampoo, defaults (frequency 1)": {"precondition_frequency": 1},
    "shampoo, unpacked": _UNPACKED,
    "shampoo, unpacked, bf16 roots": {**_UNPACKED, "root_storage_dtype": "bfloat16"},
    "shampoo, packed": _PACKED,
    "shampoo, packed, bf16 roots": _PACKED_BF16,
    "shampoo, 1-D, packed, bf16 roots": {"precondition_1d": True, **_PACKED_BF16},
    "shampoo, unpacked, one-sided > 4096": {**_UNPACKED, **_ONE_SIDED},
    "shampoo, one-sided > 4096, packed, bf16 roots": {**_PACKED_BF16, **_ONE_SIDED},
    "shampoo, packed, roots not kept (frequency 1)": _NOT_KEPT,
    "shampoo, 1-D, packed, roots not kept (frequency 1)": {"precondition_1d": True, **_NOT_KEPT},
}

#: Distributed Shampoo settings measured, by name. Its own defaults precondition
#: vectors and pack factors and roots; "no 1-D" sets ``inverse_exponent_override``
#: {1: 0.0} (matroot's default ``precondition_1d=False``); "bf16 roots" sets
#: ``inv_factor_matrix_dtype=torch.bfloat16`` (matroot's ``root_storage_dtype``);
#: "one-sided" gives the long dimensions an exponent of 0 (``max_preconditioned_dim``).
META_POLICIES: dict[str, dict[str, Any]] = {
    "distributed_shampoo": {"vectors": True},
    "distributed_shampoo, no 1-D": {"vectors": False},
    "distributed_shampoo, no 1-D, bf16 roots": {"vectors": False, "bf16_roots": True},
    "distributed_shampoo, no 1-D, one-sided > 4096": {"vectors": False, "one_sided": True},
}

#: Pairs (matroot policy, Meta policy): both at their defaults with roots refreshed every
#: step (Meta's default), then like for like (the same preconditioned dimensions).
MATCHED = [
    ("shampoo, defaults (frequency 1)", "distributed_shampoo"),
    ("shampoo, packed", "distributed_shampoo, no 1-D"),
    ("shampoo, packed, bf16 roots", "distributed_shampoo, no 1-D"),
    ("shampoo, packed, bf16 roots", "distributed_shampoo, no 1-D, bf16 roots"),
    ("shampoo, 1-D, packed, bf16 roots", "distributed_shampoo"),
    ("shampoo, one-sided > 4096, packed, bf16 roots",
     "distributed_shampoo, no 1-D, one-sided > 4096"),
    # Meta's default precondition_frequency is 1, and its arrays do not depend on it.
    ("shampoo, packed, roots not kept (frequency 1)", "distributed_shampoo, no 1-D"),
    ("shampoo, packed, roots not kept (frequency 1)", "distributed_shampoo, no 1-D, bf16 roots"),
    ("shampoo, 1-D, packed, roots not kept (frequency 1)", "distributed_shampoo"),
]


def tensor_bytes(obj, seen=None) -> int:
    """Bytes of the tensors reachable from ``obj`` (dicts, lists, tuples), each storage once."""
    import torch

    seen = set() if seen is None else seen
    if torch.is_tensor(obj):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    return 0


def _one_step(make, shapes) -> int:
    import torch

    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    opt = make(params)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    opt.step()
    if hasattr(opt, "diagnostics"):
        return opt.diagnostics()["state_bytes"]
    # Distributed Shampoo keeps its factors and roots in per-group lists outside
    # ``opt.state``; its state_dict returns those same tensors (no copies).
    return tensor_bytes([list(opt.state.values()), opt.state_dict()["state"]])


def _meta_groups(ds, params, *, vectors: bool, one_sided: bool = False,
                 bf16_roots: bool = False) -> list[dict]:
    """Parameter groups carrying the ``inverse_exponent_override`` of one Meta policy.

    Meta's override is per tensor order, so parameters whose long dimensions differ
    go into groups of their own.
    """
    import torch

    groups: dict[tuple, list] = {}
    for p in params:
        long_dims = tuple(d for d, n in enumerate(p.shape) if one_sided and n > _ONE_SIDED_LIMIT)
        groups.setdefault(long_dims, []).append(p)
    out = []
    for long_dims, members in groups.items():
        override: dict[int, Any] = {} if vectors else {1: 0.0}
        if long_dims:
            override[len(members[0].shape)] = {d: 0.0 for d in long_dims}
        out.append({"params": members, "preconditioner_config":
                    ds.RootInvShampooPreconditionerConfig(
                        amortized_computation_config=ds.DefaultEigenConfig,
                        inverse_exponent_override=override,
                        inv_factor_matrix_dtype=torch.bfloat16 if bf16_roots else torch.float32)})
    return out


def _distributed_shampoo(block_size, **policy):
    if importlib.util.find_spec("distributed_shampoo") is None:
        return None
    import distributed_shampoo as ds

    def make(params):
        # matroot's defaults, in Meta's names (docs/optimizer.rst, migration table).
        return ds.DistributedShampoo(
            _meta_groups(ds, params, **policy),
            lr=1e-3, betas=(0.9, 0.999), epsilon=1e-8, weight_decay=1e-2,
            weight_decay_type=ds.WeightDecayType.DECOUPLED,
            max_preconditioner_dim=block_size, precondition_frequency=_NO_REFRESH,
            start_preconditioning_step=_NO_REFRESH,
            grafting_config=ds.AdamPreconditionerConfig(beta2=0.999, epsilon=1e-8))

    return make


def memory_report(block_size: int = 1024, models=None) -> dict:
    """State bytes per parameter of every optimizer on every model.

    Returns
    -------
    dict
        ``{model: {"parameters": int, "bytes_per_parameter": {optimizer: float or None},
        "vs_distributed_shampoo": {"ours / theirs": ratio or None}}}`` over the pairs
        of :data:`MATCHED`; None where Distributed Shampoo is not installed.
    """
    import torch

    from matroot.optim import Shampoo

    makers = {"adamw": functools.partial(torch.optim.AdamW, lr=1e-3)}
    for name, options in POLICIES.items():
        makers[name] = functools.partial(Shampoo, block_size=block_size, distributed=None,
                                         **{"precondition_frequency": _NO_REFRESH, **options})
    for name, options in META_POLICIES.items():
        makers[name] = _distributed_shampoo(block_size, **options)
    out = {}
    for model, shapes in (models or MODELS).items():
        count = sum(math.prod(s) for s in shapes)
        per_parameter = {name: None if make is None else _one_step(make, shapes) / count
                         for name, make in makers.items()}
        out[model] = {"parameters": count, "bytes_per_parameter": per_parameter,
                      "vs_distributed_shampoo": {
                          f"{ours} / {theirs}": None if per_parameter[theirs] is None
                          else per_parameter[ours] / per_parameter[theirs]
                          for ours, theirs in MATCHED}}
    return out


def format_memory_table(report: dict) -> str:
    """Markdown tables: bytes per parameter (ratio to AdamW), and the matched ratios."""
    models = list(report)
    names = list(report[models[0]]["bytes_per_parameter"])
    header = "| optimizer | " + " | ".join(
        f"{m} ({report[m]['parameters']:,} parameters)" for m in models) + " |"
    rule = "|---|" + "---|" * len(models)
    lines = [header, rule]
    for name in names:
        cells = []
        for m in models:
            b, adamw = (report[m]["bytes_per_parameter"][k] for k in (name, "adamw"))
            cells.append("not installed" if b is None else f"{b:.2f} ({b / adamw:.2f}×)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "matroot / Distributed Shampoo (the first row: both at their defaults, roots "
              "every step; then the same preconditioned dimensions):", "",
              "| matroot | Distributed Shampoo | " + " | ".join(models) + " |",
              "|---|---|" + "---|" * len(models)]
    for ours, theirs in MATCHED:
        ratios = [report[m]["vs_distributed_shampoo"][f"{ours} / {theirs}"] for m in models]
        lines.append(f"| {ours} | {theirs} | " + " | ".join(
            "not installed" if r is None else f"{r:.2f}×" for r in ratios) + " |")
    return ("Optimizer-state bytes per parameter (ratio to AdamW), block_size "
            "as given, float32 parameters, after one step.\n\n" + "\n".join(lines))
