"""Optimizer-step benchmark: stacked Shampoo vs a per-block loop, measured side by side.

The model is a stack of linear layers of widths 256–1024 plus a few odd shapes
(a ragged 1000×300 weight, a conv kernel, an embedding, biases), cut into
blocks of ``--block-size``. Both contenders run the same functional core on the
same gradients; they differ only in the block plan:

- ``stacked``: equal-shape blocks in one batched product, equal-size factors in
  one ``(b, n, n)`` stack and one ``inv_root`` call per size (matroot, DASH);
- ``per_block``: every block and every factor on its own, one ``inv_root`` call
  per factor (the structure of Distributed Shampoo).

Roots are refreshed every step, so a step's time is the worst case; the split
reports factor updates, inverse roots and the rest (moments, preconditioning,
grafting, updates). Steps of the two contenders alternate, so a burst of
machine noise hits both and the ratio stays honest.

Run::

    python -m matroot.bench.optim --quick          # CPU, a few seconds per step
    python -m matroot.bench.optim --device cuda    # the full model on a GPU
"""

from __future__ import annotations

from typing import Any

import argparse
import itertools
import json
import pathlib
import platform
import statistics
import time

import numpy as np

from ..optim import ShampooConfig, apply_updates, init, state_bytes, update

__all__ = ["model_shapes", "main"]

PHASES = ("moments", "factors", "roots", "precondition", "updates")


def model_shapes(quick: bool) -> list[tuple[int, ...]]:
    """Parameter shapes of the benchmark model (weights and biases)."""
    widths = [256, 384, 512, 256] if quick else [256, 512, 768, 1024, 1024, 768, 512, 256]
    shapes = []
    for fan_in, fan_out in itertools.pairwise(widths):
        shapes += [(fan_out, fan_in), (fan_out,)]
    shapes += [(1000, 300), (300,)] if not quick else [(500, 300), (300,)]
    shapes += [(64, 32, 3, 3), (64,), (2000 if quick else 8000, 256), (256, 256, 1, 1)]
    return shapes


def _namespace(backend: str, device: str):
    if backend == "numpy":
        if device != "cpu":
            raise ValueError("the numpy backend runs on the cpu only")
        return np, (lambda a: a), (lambda: None)
    import torch

    dev = torch.device(device)

    def to_backend(a):
        return torch.from_numpy(a).to(dev)

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    return torch, to_backend, sync


class _PhaseClock:
    """Accumulates the seconds between successive ``on_phase`` calls."""

    def __init__(self, sync):
        self.sync = sync
        self.totals = {p: 0.0 for p in PHASES}
        self.mark = None

    def start(self):
        self.sync()
        self.mark = time.perf_counter()

    def __call__(self, name):
        self.sync()
        now = time.perf_counter()
        self.totals[name] += now - self.mark
        self.mark = now


def run(args) -> dict:
    xp, to_backend, sync = _namespace(args.backend, args.device)
    rng = np.random.default_rng(0)
    shapes = model_shapes(args.quick)
    params0 = [rng.standard_normal(s).astype(np.float32) * 0.02 for s in shapes]
    grad_sets = [[to_backend(rng.standard_normal(s).astype(np.float32)) for s in shapes]
                 for _ in range(3)]
    contenders: dict[str, dict[str, Any]] = {}
    for name, stacked in (("stacked", True), ("per_block", False)):
        config = ShampooConfig(lr=1e-3, block_size=args.block_size, precondition_frequency=1,
                               start_preconditioning_step=1, root_method=args.method,
                               matrix_eps=1e-6, stacked=stacked)
        params = [to_backend(p.copy()) for p in params0]
        contenders[name] = dict(config=config, params=params, state=init(params, config),
                                times=[], phases=[])

    def one_step(c, grads, record):
        clock = _PhaseClock(sync)
        clock.start()
        start = clock.mark
        updates, c["state"] = update(grads, c["state"], c["params"], c["config"],
                                     on_phase=clock)
        c["params"] = apply_updates(c["params"], updates)
        sync()
        if record:
            c["times"].append(time.perf_counter() - start)
            c["phases"].append(clock.totals)

    for k in range(args.warmup + args.steps):
        grads = grad_sets[k % len(grad_sets)]
        order = ("stacked", "per_block") if k % 2 == 0 else ("per_block", "stacked")
        for name in order:
            one_step(contenders[name], grads, record=k >= args.warmup)

    out = {}
    for name, c in contenders.items():
        plan = c["state"].plan
        med = statistics.median(c["times"])
        phases = {p: statistics.median(ph[p] for ph in c["phases"]) for p in PHASES}
        memory = state_bytes(c["state"])
        out[name] = dict(
            step_ms=1e3 * med,
            step_ms_all=[1e3 * t for t in c["times"]],
            split_ms={"factor_updates": 1e3 * phases["factors"],
                      "inverse_roots": 1e3 * phases["roots"],
                      "rest": 1e3 * (phases["moments"] + phases["precondition"]
                                     + phases["updates"])},
            inv_root_calls_per_refresh=len(plan.stacks),
            batched_products_per_step=len(plan.groups),
            root_failures=int(sum(int(xp.sum(f)) for f in c["state"].root_failures)),
            state_bytes=memory["total"], state_bytes_per_parameter=memory["per_parameter"],
            state_bytes_split={k: memory[k] for k in ("moments", "factors", "roots", "counters")})
    plan = contenders["stacked"]["state"].plan
    return dict(
        backend=args.backend, device=args.device, method=args.method, threads=args.threads,
        block_size=args.block_size, quick=args.quick, warmup=args.warmup, steps=args.steps,
        parameters=int(sum(np.prod(s) for s in shapes)), shapes=[list(s) for s in shapes],
        blocks=plan.num_blocks, factor_sizes=sorted({s.size for s in plan.stacks}),
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
        results=out,
        speedup_stacked_over_per_block=out["per_block"]["step_ms"] / out["stacked"]["step_ms"],
        inverse_root_speedup=(out["per_block"]["split_ms"]["inverse_roots"]
                              / max(out["stacked"]["split_ms"]["inverse_roots"], 1e-9)),
    )


def format_table(report: dict) -> str:
    lines = [
        f"Optimizer step, {report['parameters']:,} parameters in {report['blocks']} blocks "
        f"(block_size {report['block_size']}), inv_root method {report['method']}, "
        f"{report['backend']} on {report['device']}, roots refreshed every step; "
        f"medians of {report['steps']} steps.",
        "",
        "| layout | step ms | factor updates ms | inverse roots ms | rest ms | inv_root calls "
        "| state bytes/param |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in report["results"].items():
        s = r["split_ms"]
        lines.append(f"| {name} | {r['step_ms']:.1f} | {s['factor_updates']:.1f} | "
                     f"{s['inverse_roots']:.1f} | {s['rest']:.1f} | "
                     f"{r['inv_root_calls_per_refresh']} | {r['state_bytes_per_parameter']:.1f} |")
    lines += ["", f"stacked / per-block speedup, whole step: "
              f"{report['speedup_stacked_over_per_block']:.2f}x; inverse roots alone: "
              f"{report['inverse_root_speedup']:.2f}x"]
    return "\n".join(lines)


def main(argv=None) -> int:
    """Entry point of ``python -m matroot.bench.optim`` (and ``matroot bench optim``)."""
    parser = argparse.ArgumentParser(prog="matroot bench optim",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smaller model (widths 256-512) for a short CPU run")
    parser.add_argument("--backend", choices=("torch", "numpy"), default="torch")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--method", default="auto",
                        help="inv_root method (auto, evd, newton_db, coupled_newton, ...)")
    parser.add_argument("--block-size", type=int, default=None,
                        help="largest block side (default 128 with --quick, else 256)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per layout")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default); 1 is steadier on a "
                             "machine shared with other jobs")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="write the report as JSON here (and a .md table beside it)")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 3 if args.quick else 5
    if args.block_size is None:
        args.block_size = 128 if args.quick else 256
    if args.threads and args.backend == "torch":
        import torch

        torch.set_num_threads(args.threads)
    report = run(args)
    table = format_table(report)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
