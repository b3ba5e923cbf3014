"""Optimizer-step benchmark: stacked Shampoo vs a per-block loop, measured side by side.

The model is a stack of linear layers of widths 256–1024 plus a few odd shapes
(a ragged 1000×300 weight, a conv kernel, an embedding, biases), cut into
blocks of ``--block-size``. Both contenders run the same functional core on the
same gradients; they differ only in the block plan:

- ``stacked``: equal-shape blocks in one batched product, equal-size factors in
  one ``(b, n, n)`` stack and one ``inv_root`` call per size (matroot, DASH);
- ``per_block``: every block and every factor on its own, one ``inv_root`` call
  per factor (the structure of Distributed Shampoo).

When Meta's ``distributed_shampoo`` is importable (it is not on PyPI: a source
checkout on ``PYTHONPATH``) and the backend is torch, the same model also runs
through two ``torch.optim`` optimizers side by side, ``matroot.optim.Shampoo`` and
``DistributedShampoo`` (its default eigh root, float64 retry), with the same
block size, ridge and Adam grafting, roots every step and every 10 steps
(:func:`against_distributed_shampoo`).

With ``--compile`` (torch), ``Shampoo.step`` is also timed under ``torch.compile``
against itself eager, on steps without a root refresh, and the compile time
reported (:mod:`bench.optim_compile`).

Roots are refreshed every step, so a step's time is the worst case; the split
reports factor updates, inverse roots and the rest (moments, preconditioning,
grafting, updates). Steps of the two contenders alternate, so a burst of
machine noise hits both and the ratio stays honest.

Run::

    python -m bench optim --quick                    # CPU, a few seconds per step
    python -m bench optim --backend torch-cuda       # the full model on a GPU
    python -m bench optim --quick --compile          # and the step under torch.compile
"""

from __future__ import annotations

import importlib.util
import itertools
import platform
import statistics
import time
from typing import Any

import numpy as np

from matroot.cli.threads import describe_threads
from matroot.optim import ShampooConfig, apply_updates, init, state_bytes, update

from . import optim_compile

__all__ = ["model_shapes", "run", "format_table", "against_distributed_shampoo",
           "DEFAULTS"]

#: Defaults per preset, stated once for the command line and its help.
DEFAULTS = {"quick": dict(block_size=128, steps=3), "full": dict(block_size=256, steps=5)}

PHASES = ("moments", "factors", "roots", "precondition", "updates")
#: The second root schedule timed against Distributed Shampoo (matroot's default).
RARE_FREQUENCY = 10


def model_shapes(quick: bool) -> list[tuple[int, ...]]:
    """Parameter shapes of the benchmark model (weights and biases)."""
    widths = [256, 384, 512, 256] if quick else [256, 512, 768, 1024, 1024, 768, 512, 256]
    shapes = []
    for fan_in, fan_out in itertools.pairwise(widths):
        shapes += [(fan_out, fan_in), (fan_out,)]
    shapes += [(1000, 300), (300,)] if not quick else [(500, 300), (300,)]
    shapes += [(64, 32, 3, 3), (64,), (2000 if quick else 8000, 256), (256, 256, 1, 1)]
    return shapes


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


def run(target, *, quick: bool, method: str, block_size: int, steps: int, warmup: int,
        progress=None, compile_backend: str | None = None) -> dict:
    """Time ``warmup + steps`` alternating steps of both layouts on ``target``.

    ``progress`` (a :class:`~matroot.cli.progress.Progress` or None) counts steps.
    ``compile_backend`` (torch only): also time ``torch.compile(opt.step)`` with this
    backend against the eager step (:func:`~bench.optim_compile.compiled_step`).
    """
    xp, to_backend, sync = target.xp, target.asarray, target.synchronize
    rng = np.random.default_rng(0)
    shapes = model_shapes(quick)
    params0 = [rng.standard_normal(s).astype(np.float32) * 0.02 for s in shapes]
    grad_sets = [[to_backend(rng.standard_normal(s).astype(np.float32)) for s in shapes]
                 for _ in range(3)]
    contenders: dict[str, dict[str, Any]] = {}
    for name, stacked in (("stacked", True), ("per_block", False)):
        config = ShampooConfig(lr=1e-3, block_size=block_size, precondition_frequency=1,
                               start_preconditioning_step=1, root_method=method,
                               matrix_eps=1e-6, stacked=stacked,
                               keep_roots=True)
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

    for k in range(warmup + steps):
        grads = grad_sets[k % len(grad_sets)]
        order = ("stacked", "per_block") if k % 2 == 0 else ("per_block", "stacked")
        for name in order:
            one_step(contenders[name], grads, record=k >= warmup)
        if progress is not None:
            progress.step(f"step {k + 1} of {warmup + steps}"
                          + (" (warm-up)" if k < warmup else ""))

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
    versus = versus_rare = compiled = None
    if target.backend == "torch":
        versus = against_distributed_shampoo(params0, grad_sets, method=method,
                                             block_size=block_size, steps=steps,
                                             warmup=warmup, device=target.device)
        versus_rare = against_distributed_shampoo(
            params0, grad_sets, method=method, block_size=block_size,
            steps=RARE_FREQUENCY * max(1, steps // 2), warmup=warmup, device=target.device,
            frequency=RARE_FREQUENCY)
        if compile_backend is not None:
            compiled = optim_compile.compiled_step(
                params0, grad_sets, method=method, block_size=block_size, steps=steps,
                device=target.device, backend=compile_backend)
    return dict(
        backend=target.name, device=target.device, method=method,
        block_size=block_size, quick=quick, warmup=warmup, steps=steps,
        parameters=int(sum(np.prod(s) for s in shapes)), shapes=[list(s) for s in shapes],
        blocks=plan.num_blocks, factor_sizes=sorted({s.size for s in plan.stacks}),
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
        results=out,
        speedup_stacked_over_per_block=out["per_block"]["step_ms"] / out["stacked"]["step_ms"],
        inverse_root_speedup=(out["per_block"]["split_ms"]["inverse_roots"]
                              / max(out["stacked"]["split_ms"]["inverse_roots"], 1e-9)),
        distributed_shampoo=versus,
        distributed_shampoo_rare_roots=versus_rare,
        compiled_step=compiled,
    )


def against_distributed_shampoo(params0, grad_sets, *, method: str, block_size: int,
                                steps: int, warmup: int, device: str = "cpu",
                                frequency: int = 1):
    """``step()`` times of ``matroot.optim.Shampoo`` and Meta's ``DistributedShampoo``.

    Both get the same initial parameters and gradients (assigned to ``.grad``),
    alternating step by step; roots are refreshed every ``frequency`` steps from step
    ``frequency`` on (Meta's earliest start), ridge 1e-6, Adam grafting (β₂ = 0.999).
    Every step: medians; every ``frequency > 1`` steps: means over the timed steps
    (a whole number of periods), since the median would leave out the refreshes.
    None when ``distributed_shampoo`` is not importable.
    """
    if importlib.util.find_spec("distributed_shampoo") is None:
        return None
    import distributed_shampoo as ds
    import torch

    from matroot.optim import Shampoo

    makers = {
        "matroot": lambda ps: Shampoo(ps, lr=1e-3, block_size=block_size, distributed=None,
                                      precondition_frequency=frequency,
                                      start_preconditioning_step=frequency,
                                      root_method=method, matrix_eps=1e-6),
        "distributed_shampoo": lambda ps: ds.DistributedShampoo(
            ps, lr=1e-3, betas=(0.9, 0.999), epsilon=1e-6, max_preconditioner_dim=block_size,
            precondition_frequency=frequency, start_preconditioning_step=frequency,
            grafting_config=ds.AdamPreconditionerConfig(beta2=0.999, epsilon=1e-8)),
    }
    runs: dict[str, tuple] = {}
    for name, make in makers.items():
        params = [torch.nn.Parameter(torch.asarray(p.copy(), device=device)) for p in params0]
        runs[name] = (params, make(params), [])
    for k in range(warmup + steps):
        for name in (list(runs) if k % 2 == 0 else list(reversed(runs))):
            params, optimizer, times = runs[name]
            for param, grad in zip(params, grad_sets[k % len(grad_sets)]):
                param.grad = grad.clone()
            start = time.perf_counter()
            optimizer.step()
            if device != "cpu":
                torch.cuda.synchronize()
            if k >= warmup:
                times.append(time.perf_counter() - start)
    average = statistics.median if frequency == 1 else statistics.fmean
    step_ms = {name: 1e3 * average(times) for name, (_, _, times) in runs.items()}
    return dict(step_ms=step_ms, root_method=method, precondition_frequency=frequency,
                steps=steps, matroot_over_distributed_shampoo=step_ms["matroot"]
                / step_ms["distributed_shampoo"])


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
    if "threads" in report:
        lines += ["", describe_threads(report["threads"])]
    lines += ["", f"stacked / per-block speedup, whole step: "
              f"{report['speedup_stacked_over_per_block']:.2f}x; inverse roots alone: "
              f"{report['inverse_root_speedup']:.2f}x"]
    for key, what in (("distributed_shampoo", "roots every step (medians)"),
                      ("distributed_shampoo_rare_roots",
                       f"roots every {RARE_FREQUENCY} steps (means)")):
        versus = report.get(key)
        if versus is not None:
            ms = versus["step_ms"]
            lines += ["", f"torch optimizers, {what}: matroot.optim.Shampoo "
                      f"{ms['matroot']:.1f} ms, Distributed Shampoo "
                      f"{ms['distributed_shampoo']:.1f} ms per step: "
                      f"{versus['matroot_over_distributed_shampoo']:.2f}x"]
    if report.get("compiled_step") is not None:
        lines += ["", optim_compile.describe(report["compiled_step"])]
    return "\n".join(lines)
