"""The solver benchmark: every matroot method against batched and looped eigh.

``python -m bench solvers`` runs it (``--quick`` for a short CPU run). Three
experiments go into one ``solvers.json`` (with Markdown/RST summaries from
:mod:`bench.report` and PNG plots from :mod:`bench.plots`):
:mod:`~bench.sweep` (time, matmuls and error over sizes, batches and p),
:mod:`~bench.time_to_accuracy` (error against time and matmuls as the
step count grows) and :mod:`~bench.scaling_iterations` (iterations
against κ for power vs Frobenius scaling).

Times are only compared with times measured in the same run on the same
device; the reported numbers are ratios. Each backend is timed in a worker
process of its own (:mod:`bench.workers`) under the run's thread
policy (:mod:`matroot.cli.threads`). Every record carries the ``seed`` of its
stack: :func:`matroot.testing.scaled_spd_stack` ``(batch, n, kappa, seed=seed)``
rebuilds it.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import matroot
from matroot.cli.contenders import BASELINES
from matroot.cli.threads import thread_policy
from matroot.testing.backends import select_targets, target_named

from .config import Config, all_methods, baselines_for, config_to_json, methods_for
from .machine import machine_description
from .prepared import prepare_problems
from .report import write_summaries
from .sweep import sweep_summary
from .time_to_accuracy import tta_summary
from .workers import json_default, run_worker, worker_environment

__all__ = ["run", "benchmark_targets", "SCHEMA"]

SCHEMA = "matroot.bench.solvers/1"


def benchmark_targets(config: Config) -> list:
    """The targets of ``config``: the named ones, or every available one but
    array_api_strict (a conformance backend, not a fast one)."""
    if config.backends is not None:
        return select_targets(list(config.backends))
    return [t for t in select_targets() if t.backend != "array_api_strict"]


def run(config: Config, out_dir, *, plots: bool = True, stream=None) -> dict:
    """Run the experiments of ``config``; write ``solvers.json`` (and plots) to ``out_dir``.

    The parent draws the matrices and solves their oracles beforehand, so every
    worker sees the same problems. Progress goes to ``stream`` (default stderr).

    Returns
    -------
    dict
        The JSON document that was written.

    Examples
    --------
    >>> import io, tempfile
    >>> from dataclasses import replace
    >>> from bench.config import PRESETS
    >>> from bench.solvers import run
    >>> config = replace(PRESETS["smoke"], backends=("numpy",), experiments=("sweep",))
    >>> with tempfile.TemporaryDirectory() as out:
    ...     doc = run(config, out, plots=False, stream=io.StringIO())
    >>> evd = [r for r in doc["sweep"] if r["method"] == "evd"]
    >>> [r["p"] for r in evd], all(r["err_max"] < 1e-6 for r in evd)
    ([2, 4], True)
    """
    stream = sys.stderr if stream is None else stream
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = benchmark_targets(config)
    tta_target = _pick_tta_target(config, targets)
    assignments = [(t, _worker_experiments(config, t, tta_target)) for t in targets]
    total = sum(_count_steps(config, experiments) for _, experiments in assignments)
    started = time.time()
    with thread_policy(config.threads) as threads:
        print(f"matroot solver benchmark: {', '.join(t.name for t in targets)}, "
              f"{total} steps, {threads['policy']}", file=stream, flush=True)
        doc = dict(schema=SCHEMA, matroot_version=matroot.__version__,
                   created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   machine=machine_description(targets, worker_environment(config.threads)),
                   threads=threads, config=config_to_json(config),
                   methods=sorted(all_methods()), baselines=list(BASELINES),
                   backends=[t.name for t in targets],
                   time_to_accuracy_backend=tta_target.name, skipped=[])
        _measure(config, assignments, doc, dict(started=started, done=0, total=total), stream)
    if "sweep" in doc:
        doc["sweep_summary"] = sweep_summary(doc["sweep"])
    if "time_to_accuracy" in doc:
        doc["time_to_accuracy_summary"] = tta_summary(doc["time_to_accuracy"])
    doc["elapsed_s"] = time.time() - started
    path = out_dir / "solvers.json"
    path.write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
    print(f"wrote {path} ({doc['elapsed_s']:.0f} s)", file=stream, flush=True)
    for summary in write_summaries(doc, out_dir):
        print(f"wrote {summary}", file=stream, flush=True)
    if plots:
        from .plots import make_plots

        for png in make_plots(doc, out_dir):
            print(f"wrote {png}", file=stream, flush=True)
    return doc


def _measure(config, assignments, doc, count, stream) -> None:
    """Draw the stacks, run one worker per target, and merge their records into ``doc``."""
    with tempfile.TemporaryDirectory(prefix="matroot-bench-") as tmp_name:
        tmp = Path(tmp_name)
        problems = prepare_problems(config, tmp, stream)
        for target, experiments in assignments:
            part = run_worker(tmp, dict(config=config_to_json(config), target=target.name,
                                        experiments=experiments, problems=problems, **count),
                              stream)
            count["done"] += _count_steps(config, experiments)
            doc["skipped"] += part.pop("skipped")
            doc["machine"].setdefault("workers", []).extend(part.pop("workers"))
            for key, rows in part.items():
                doc.setdefault(key, []).extend(rows)


def _pick_tta_target(config, targets):
    if config.tta_backend is not None:
        wanted = target_named(config.tta_backend)
        if wanted not in targets:
            raise ValueError(f"tta backend {config.tta_backend!r} is not among this run's "
                             f"backends ({', '.join(t.name for t in targets)})")
        return wanted
    for preferred in ("torch-cuda", "cupy", "torch"):
        for target in targets:
            if target.name == preferred:
                return target
    return targets[0]


def _worker_experiments(config, target, tta_target):
    return [e for e in config.experiments if e == "sweep" or target == tta_target]


def _count_steps(config, experiments):
    steps = 0
    if "sweep" in experiments:
        per_config = sum(len(methods_for(config, p)) + len(baselines_for(config))
                         for p in config.ps)
        steps += per_config * sum(len(config.batches_for(n)) for n in config.sizes)
    if "time_to_accuracy" in experiments:
        steps += len(config.tta_kappas) * sum(len(methods_for(config, p)) for p in config.ps)
    if "scaling" in experiments:
        steps += len(config.scaling_kappas) * len(config.scaling_spectra)
    return steps
