"""Optimizer-state memory: bytes per parameter for AdamW, matroot's Shampoo policies and
Distributed Shampoo (when importable), on the same models.

Each optimizer takes one step on random gradients, after which every array it will
ever hold exists (matroot allocates a stack's factors and roots together at its first
gradient; no root needs computing for that, so none is); the bytes are those of the
tensors it keeps (moments, factors, inverse roots, counters), counted once per storage.

Meta's Distributed Shampoo has no package on PyPI (it is installed from its
repository), so the requirements cannot pin it; its column appears when
``distributed_shampoo`` is importable and reads "not installed" otherwise.

Run::

    matroot bench optim --memory
"""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import Any

#: A precondition_frequency past the one step taken: memory without solver time.
_NO_REFRESH = 10**9

__all__ = ["MODELS", "POLICIES", "tensor_bytes", "memory_report", "format_memory_table"]

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

#: matroot Shampoo settings measured, by name (ShampooConfig fields).
POLICIES: dict[str, dict[str, Any]] = {
    "shampoo": {},
    "shampoo, bf16 roots": {"root_storage_dtype": "bfloat16"},
    "shampoo, packed, bf16 roots": {"symmetric_packing": True,
                                            "root_storage_dtype": "bfloat16"},
    "shampoo, one-sided > 4096": {"max_preconditioned_dim": 4096},
    "shampoo, one-sided > 4096, packed, bf16 roots": {"max_preconditioned_dim": 4096,
                                                      "symmetric_packing": True,
                                                      "root_storage_dtype": "bfloat16"},
}


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
    return tensor_bytes(list(opt.state.values()))


def _distributed_shampoo(block_size):
    if importlib.util.find_spec("distributed_shampoo") is None:
        return None
    import distributed_shampoo as ds

    def make(params):
        return ds.DistributedShampoo(
            params, lr=1e-3, betas=(0.9, 0.999), epsilon=1e-12, weight_decay=1e-2,
            max_preconditioner_dim=block_size, precondition_frequency=_NO_REFRESH,
            use_decoupled_weight_decay=True,
            grafting_config=ds.AdamGraftingConfig(beta2=0.999, epsilon=1e-8))

    return make


def memory_report(block_size: int = 1024, models=None) -> dict:
    """State bytes per parameter of every optimizer on every model.

    Returns
    -------
    dict
        ``{model: {"parameters": int, "bytes_per_parameter": {optimizer: float or None}}}``;
        None where the optimizer is not installed.
    """
    import torch

    from ..optim import Shampoo

    makers = {"adamw": functools.partial(torch.optim.AdamW, lr=1e-3)}
    for name, options in POLICIES.items():
        makers[name] = functools.partial(Shampoo, block_size=block_size, distributed=None,
                                         precondition_frequency=_NO_REFRESH, **options)
    makers["distributed_shampoo"] = _distributed_shampoo(block_size)
    out = {}
    for model, shapes in (models or MODELS).items():
        count = sum(math.prod(s) for s in shapes)
        out[model] = {"parameters": count, "bytes_per_parameter": {
            name: None if make is None else _one_step(make, shapes) / count
            for name, make in makers.items()}}
    return out


def format_memory_table(report: dict) -> str:
    """A markdown table: bytes per parameter, and the ratio to AdamW's."""
    names = list(next(iter(report.values()))["bytes_per_parameter"])
    lines = ["| model | parameters | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for model, r in report.items():
        adamw = r["bytes_per_parameter"]["adamw"]
        cells = ["not installed" if b is None else f"{b:.2f} ({b / adamw:.2f}×)"
                 for b in r["bytes_per_parameter"].values()]
        lines.append(f"| {model} | {r['parameters']:,} | " + " | ".join(cells) + " |")
    return ("Optimizer-state bytes per parameter (ratio to AdamW), block_size "
            "as given, float32 parameters, after one step.\n\n" + "\n".join(lines))
