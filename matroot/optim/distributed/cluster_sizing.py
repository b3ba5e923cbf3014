"""Size a cluster for sharded Shampoo from parameter shapes alone.

``matroot plan --model llama-953m --world-size 8 64 512`` (its command line is
:mod:`matroot.cli.plan`) prints, for each world size, how the
Shampoo blocks of a model split over the ranks: blocks per rank, the per-rank
cost balance (largest over mean, and the best any split could reach), the
optimizer memory per rank and the bytes all-gathered per step. The blocking is
the optimizer's own (:func:`matroot.optim.shampoo_core.blocking.plan_blocks`) and the split
the one :class:`matroot.optim.Shampoo` uses under ``torch.distributed``
(:func:`matroot.optim.distributed.sharding.shard_plan`), so the numbers are the run's.

Shapes come from a built-in model (``--model``), from ``--shapes
2048x2048,5632x2048,2048`` or from a JSON file (``--shapes-json``) holding a list
of shapes or an object mapping parameter names to shapes.
"""

from __future__ import annotations

from typing import Any

import json
import math

from ..shampoo_core.blocking import DEFAULT_MAX_FACTOR_RATIO, ELEMENTWISE, FactorPolicy, plan_blocks
from .sharding import (
    DTYPE_BYTES,
    best_balance,
    group_cost,
    factor_bytes,
    gather_buckets,
    moment_bytes,
    shard_plan,
)

__all__ = [
    "MODELS",
    "llama_shapes",
    "parse_shapes",
    "load_shapes_json",
    "plan_summary",
    "format_summary",
    "fsdp2_per_rank",
    "format_fsdp2",
]

#: Llama MLP width for width 2048: 8/3·2048 rounded up to a multiple of 256
#: (5632, also TinyLlama's and the DASH 953M model's).
LLAMA_953M_MLP = 5632


def llama_shapes(*, layers: int, width: int, mlp: int, vocab: int) -> list:
    """``(name, shape)`` of every parameter of a Llama with an untied LM head.

    Per layer: RMSNorm weights before attention and MLP, ``q, k, v, o`` of
    ``width×width`` (heads do not change the shapes: they split ``width``),
    ``gate, up`` of ``mlp×width``, ``down`` of ``width×mlp``; then the final
    RMSNorm, the embedding and the LM head, both ``vocab×width``. Shapes are
    torch's ``(out_features, in_features)``.

    Examples
    --------
    >>> shapes = llama_shapes(layers=16, width=2048, mlp=5632, vocab=32000)
    >>> sum(math.prod(s) for _, s in shapes)
    953223168
    """
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed_tokens.weight", (vocab, width))]
    for i in range(layers):
        pre = f"layers.{i}."
        shapes.append((pre + "input_layernorm.weight", (width,)))
        for proj in "qkvo":
            shapes.append((pre + f"self_attn.{proj}_proj.weight", (width, width)))
        shapes.append((pre + "post_attention_layernorm.weight", (width,)))
        shapes.append((pre + "mlp.gate_proj.weight", (mlp, width)))
        shapes.append((pre + "mlp.up_proj.weight", (mlp, width)))
        shapes.append((pre + "mlp.down_proj.weight", (width, mlp)))
    shapes.append(("norm.weight", (width,)))
    shapes.append(("lm_head.weight", (vocab, width)))
    return shapes


#: Built-in shape sets for ``--model``.
MODELS = {
    "llama-953m": lambda: llama_shapes(layers=16, width=2048, mlp=LLAMA_953M_MLP,
                                       vocab=32000),
}


def _shape(value, where: str) -> tuple:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise ValueError(f"{where}: a shape must be a list of integers, got {value!r}")
    if any(d < 0 for d in value):
        raise ValueError(f"{where}: dimensions must be >= 0, got {list(value)}")
    return tuple(value)


def parse_shapes(text: str) -> list:
    """``"2048x2048,5632x2048,2048"`` -> ``[("0", (2048, 2048)), ...]``.

    A dimension list is separated by ``x``; an empty entry or ``()`` is a scalar.

    Raises
    ------
    ValueError
        For anything but positive integers separated by ``x`` and ``,``.

    Examples
    --------
    >>> parse_shapes("4x3, 7")
    [('0', (4, 3)), ('1', (7,))]
    """
    if not text.replace(",", "").strip():
        raise ValueError("--shapes is empty: give the parameters' shapes, e.g. "
                         "2048x2048,5632x2048,2048")
    out = []
    for i, item in enumerate(text.split(",")):
        item = item.strip()
        if item in ("", "()"):
            out.append((str(i), ()))
            continue
        try:
            dims = tuple(int(d) for d in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"--shapes entry {item!r} is not of the form 2048x1024") from None
        out.append((str(i), _shape(list(dims), f"--shapes entry {item!r}")))
    return out


def load_shapes_json(path: str) -> list:
    """Shapes from a JSON file: ``[[2048, 2048], [2048]]`` or ``{"w": [2048, 2048]}``.

    Raises
    ------
    ValueError
        If the file is not such a list or object.
    """
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if isinstance(data, dict):
        return [(str(k), _shape(v, f"{path}: {k!r}")) for k, v in data.items()]
    if isinstance(data, list):
        return [(str(i), _shape(v, f"{path}: entry {i}")) for i, v in enumerate(data)]
    raise ValueError(f"{path}: expected a list of shapes or an object of name: shape, "
                     f"got {type(data).__name__}")


def plan_summary(shapes, *, block_size: int = 1024, world_sizes=(8,), dtype: str = "float32",
                 precondition_1d: bool = False, symmetric_packing: bool = True,
                 root_storage_dtype: str | None = None, keep_roots: bool = True,
                 max_factor_ratio: float = DEFAULT_MAX_FACTOR_RATIO) -> dict:
    """The blocking of ``shapes`` and its split over each world size, as numbers.

    Parameters
    ----------
    shapes : list of (str, tuple of int)
        Parameter names and shapes.
    block_size : int
        The optimizer's ``block_size``.
    world_sizes : sequence of int
    dtype : {"float32", "float64"}
        The optimizer's state dtype (float32 for float32 and 16-bit parameters).
    precondition_1d, symmetric_packing, root_storage_dtype, keep_roots, max_factor_ratio
        The optimizer's settings of these names, its defaults (docs/memory.rst), except
        ``keep_roots``: True, as at ``precondition_frequency > 1``.

    Returns
    -------
    dict
        ``parameters``, ``elements``, ``shampoo_elements``, ``elementwise`` (tensor
        and element counts left to the Adam update), ``blocks`` (per block shape:
        count and cost), ``stacks`` (per factor size: count) and ``worlds``: per
        world size the blocks per rank (min, max), ``balance`` (max/mean cost),
        ``best_balance`` (a lower bound for any split), memory per rank in bytes
        (``preconditioner`` — sharded factors and roots, the largest rank —
        ``moments`` — the Adam moments of the elements a rank owns: its blocks' and
        its elementwise parameters', the largest rank — and ``total``, the largest
        rank's sum),
        ``allgather_bytes`` (output of the per-step all-gathers on each rank,
        padding included), ``padding_bytes``, ``collectives`` per step and
        ``fsdp2`` (:func:`fsdp2_per_rank`).

    Examples
    --------
    >>> s = plan_summary(MODELS["llama-953m"](), world_sizes=[8])
    >>> s["worlds"][0]["balance"] <= 1.05
    True
    """
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    for w in world_sizes:
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"world sizes must be positive integers, got {w!r}")
    if root_storage_dtype is not None and root_storage_dtype not in DTYPE_BYTES:
        raise ValueError(f"root_storage_dtype must be one of {sorted(DTYPE_BYTES)} or None, "
                         f"got {root_storage_dtype!r}")
    storage: dict[str, Any] = dict(packed=symmetric_packing, root_dtype=root_storage_dtype,
                                   keep_roots=keep_roots)
    names = [n for n, _ in shapes]
    dims = [tuple(s) for _, s in shapes]
    plan = plan_blocks(dims, [dtype] * len(dims), block_size=block_size,
                       policy=FactorPolicy(precondition_1d=precondition_1d,
                                           max_factor_ratio=max_factor_ratio))
    nbytes = DTYPE_BYTES[dtype]
    elements = sum(math.prod(s) for s in dims)
    left_out = [i for i, layout in enumerate(plan.params) if layout.kind == ELEMENTWISE]
    blocks: dict[tuple[int, ...], dict[str, Any]] = {}
    for group in plan.groups:
        entry = blocks.setdefault(group.shape, {"count": 0, "cost": group_cost(group)})
        entry["count"] += len(group.blocks)
    stacks: dict[int, int] = {}
    for stack_shape in plan.stacks:
        stacks[stack_shape.size] = stacks.get(stack_shape.size, 0) + stack_shape.count

    worlds = []
    for w in world_sizes:
        split = shard_plan(plan, w)
        per_rank_blocks = [sum(c[r] for c in split.counts) for r in range(w)]
        precond = [sum(split.counts[g][r] * factor_bytes(group, **storage)
                       for g, group in enumerate(plan.groups)) for r in range(w)]
        # A rank keeps the moments of the elements it owns: its blocks' and its
        # elementwise parameters'.
        moments = [moment_bytes(sum(split.counts[g][r] * math.prod(group.shape)
                                    for g, group in enumerate(plan.groups))
                                + sum(math.prod(dims[i]) for i in split.elementwise_of(r)),
                                dtype) for r in range(w)]
        gathered = padding = collectives = 0
        if w > 1:
            for bucket in gather_buckets(plan, split, [dtype] * len(dims)):
                gathered += w * bucket.padded * nbytes
                padding += (w * bucket.padded - bucket.elements) * nbytes
                collectives += 1
        total = max(p + m for p, m in zip(precond, moments))
        worlds.append({
            "world_size": w,
            "blocks_per_rank": (min(per_rank_blocks), max(per_rank_blocks)),
            "balance": split.balance,
            "best_balance": best_balance(plan, w),
            "preconditioner": max(precond),
            "moments": max(moments),
            "total": total,
            "allgather_bytes": gathered,
            "padding_bytes": padding,
            "collectives": collectives,
            "fsdp2": fsdp2_per_rank(dims, w, nbytes, optimizer_bytes=total,
                                    update_gather_bytes=gathered),
        })
    return {
        "parameters": len(dims),
        "elements": elements,
        "shampoo_elements": elements - sum(math.prod(dims[i]) for i in left_out),
        "elementwise": {"tensors": len(left_out),
                        "elements": sum(math.prod(dims[i]) for i in left_out),
                        "names": [names[i] for i in left_out]},
        "block_size": block_size,
        "dtype": dtype,
        "storage": storage,
        "blocks": blocks,
        "stacks": dict(sorted(stacks.items(), reverse=True)),
        "worlds": worlds,
    }


def fsdp2_per_rank(dims, world_size: int, nbytes: int, *, optimizer_bytes: int,
                   update_gather_bytes: int) -> dict:
    """Per-rank bytes of an FSDP2 (``fully_shard``, 1-D mesh) run with Shampoo.

    FSDP2 cuts each parameter's first dimension into ``world_size`` chunks of
    ``ceil(rows / world_size)`` rows (the last ranks get fewer, or none); rank 0
    holds the largest. Shampoo's state is the DDP split's (its blocks are cut from
    whole parameters: :mod:`matroot.optim.distributed.dtensor`); per step it gathers every
    gradient whole (and every parameter where weight decay is non-zero) and
    all-gathers the block updates.

    Returns
    -------
    dict
        ``parameters`` and ``gradients`` (rank 0's shards), ``optimizer`` (as the
        DDP split), ``transient`` (whole gradients and updates during a step),
        ``gradient_gather_bytes`` (received per step; the same again for the
        parameters with weight decay) and ``update_gather_bytes``.

    Examples
    --------
    >>> fsdp2_per_rank([(11, 6), (5,)], 2, 4, optimizer_bytes=0,
    ...                update_gather_bytes=0)["parameters"]  # 6 of 11 rows, 3 of 5
    156
    """
    shard = sum(-(-d[0] // world_size) * math.prod(d[1:]) if d else 1 for d in dims) * nbytes
    whole = sum(math.prod(d) for d in dims) * nbytes
    return {"parameters": shard, "gradients": shard, "optimizer": optimizer_bytes,
            "transient": 2 * whole, "gradient_gather_bytes": whole,
            "update_gather_bytes": update_gather_bytes}


def format_fsdp2(summary: dict) -> str:
    """The ``--fsdp2`` table of ``matroot plan``: per-rank bytes under ``fully_shard``."""
    lines = ["  FSDP2 (fully_shard on dim 0, 1-D mesh), largest rank:",
             f"  {'ranks':>6}{'params':>13}{'grads':>13}{'optimizer':>13}{'transient':>13}"
             f"{'grad gather/step':>18}{'update gather/step':>20}"]
    for w in summary["worlds"]:
        f = w["fsdp2"]
        lines.append(f"  {w['world_size']:>6}{_bytes(f['parameters']):>13}"
                     f"{_bytes(f['gradients']):>13}{_bytes(f['optimizer']):>13}"
                     f"{_bytes(f['transient']):>13}{_bytes(f['gradient_gather_bytes']):>18}"
                     f"{_bytes(f['update_gather_bytes']):>20}")
    lines.append("  grad gather: every gradient received whole (the parameters too when "
                 "weight_decay > 0); transient: whole gradients and updates during a step")
    return "\n".join(lines)


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _shape_text(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "()"


def format_summary(summary: dict, title: str) -> str:
    """The text ``main`` prints for one :func:`plan_summary`."""
    s = summary
    lines = [
        f"{title}: {s['parameters']} parameter tensors, {s['elements']:,} elements; "
        f"block size {s['block_size']}, optimizer state {s['dtype']}",
        f"  Shampoo blocks: {sum(b['count'] for b in s['blocks'].values())} "
        f"({s['shampoo_elements']:,} elements); Adam update only: "
        f"{s['elementwise']['tensors']} tensors ({s['elementwise']['elements']:,} elements)",
        "",
        f"  {'block shape':<14}{'blocks':>8}{'cost each (n^3 units)':>24}",
    ]
    unit = s["block_size"] ** 3
    for shape, b in sorted(s["blocks"].items(), key=lambda kv: (-kv[1]["cost"], kv[0])):
        lines.append(f"  {_shape_text(shape):<14}{b['count']:>8}{b['cost'] / unit:>24.3f}")
    lines.append("  factor stacks (size x count): "
                 + ", ".join(f"{n} x {c}" for n, c in s["stacks"].items()))
    lines.append("")
    header = (f"  {'ranks':>6}{'blocks/rank':>13}{'max/mean':>10}{'best':>7}"
              f"{'precond/rank':>15}{'moments/rank':>15}{'total/rank':>13}"
              f"{'all-gather/step':>17}{'padding':>9}")
    lines.append(header)
    for w in s["worlds"]:
        lo, hi = w["blocks_per_rank"]
        pad = w["padding_bytes"] / w["allgather_bytes"] if w["allgather_bytes"] else 0.0
        lines.append(
            f"  {w['world_size']:>6}{(f'{lo}-{hi}' if lo != hi else str(lo)):>13}"
            f"{w['balance']:>10.3f}{w['best_balance']:>7.3f}{_bytes(w['preconditioner']):>15}"
            f"{_bytes(w['moments']):>15}{_bytes(w['total']):>13}"
            f"{_bytes(w['allgather_bytes']):>17}{pad:>8.1%}")
    lines.append("")
    lines.append("  cost: r^3 + c^3 (inverse roots) + r*c*(r + c) (factor update) per r x c "
                 "block, a side without a factor costing nothing; best: a lower bound on "
                 "max/mean for any split")
    storage = s["storage"]
    kept = ("no roots kept" if not storage["keep_roots"] else
            f"roots in {storage['root_dtype'] or s['dtype']}")
    lines.append(f"  precond: factors ({'packed' if storage['packed'] else 'n x n'}, "
                 f"{s['dtype']}) + inverse roots ({kept}), sharded (largest rank); moments: "
                 "Adam m and v of the elements a rank owns (its blocks', its elementwise "
                 "parameters')")
    lines.append("  all-gather/step: output of the per-step all-gather on each rank, one per "
                 "dtype of the flattened block and elementwise updates")
    return "\n".join(lines)
