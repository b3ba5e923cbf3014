"""``python -m bench solvers | optim | polar | launches | plots | report``: the benchmarks'
command lines (:mod:`bench.__main__` dispatches to them).

Results go to ``--out`` (default ``./matroot-bench/`` under the current folder):
never into the installed package, and never into the repository's committed
``bench/results/`` unless that folder is named explicitly.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from matroot.cli.common import (
    UsageError,
    add_thread_option,
    at_least,
    require_module,
    writable_dir,
    writable_file,
)

DEFAULT_OUT = "matroot-bench"
_MATPLOTLIB = ("matplotlib", "the plots", 'pip install "matroot[bench]"')


def configure(parser):
    """Add the benchmark verbs to ``parser``; return its subparsers (for the scripts)."""
    verbs = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True,
                                  parser_class=type(parser))
    _configure_solvers(verbs.add_parser(
        "solvers", help="inverse-root solvers vs batched and looped eigh",
        description="Time matroot's inverse-root solvers against batched and looped eigh, "
                    "measure their error against a float64 oracle, and plot "
                    "time-to-accuracy and scaling experiments."))
    _configure_optim(verbs.add_parser(
        "optim", help="one Shampoo step: stacked blocks vs a per-block loop",
        description="Time one optimizer step (roots refreshed every step) with all "
                    "same-size blocks stacked against a per-block loop."))
    _configure_polar(verbs.add_parser(
        "polar", help="polar factor: Polar Express vs the Muon quintic vs SVD; Muon step",
        description="Products, time and orthogonality defect of matroot.polar's methods "
                    "side by side, and one stacked Muon direction against a per-parameter "
                    "loop."))
    _configure_launches(verbs.add_parser(
        "launches", help="operations and host syncs per solve (torch dispatcher) vs DASH",
        description="Count the operations (about one kernel launch each on a GPU) and "
                    "host syncs of one solve through torch's dispatcher on the CPU: "
                    "matroot's methods with fixed steps and adaptive, DASH's solvers at "
                    "the fewest steps reaching rtol (when ista-daslab-optimizers is "
                    "installed), and the optimizer rows registered with the benchmark."))
    for name, what in (("plots", "PNG plots"), ("report", "summary.md and summary.rst")):
        sub = verbs.add_parser(name, help=f"redraw the {what} of a solvers.json",
                               description=f"Write the {what} of a solver benchmark's JSON.")
        sub.add_argument("results", help="the solvers.json a benchmark run wrote")
        sub.add_argument("--out", help="output folder (default: the JSON's folder)")
        sub.set_defaults(run=_run_plots if name == "plots" else _run_report, prog=sub.prog)
    return verbs


# ---------------------------------------------------------------------------- solvers
def _configure_solvers(parser) -> None:
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_const", const="quick", dest="preset",
                        help="a reduced run (3-4 minutes on a busy 2-core CPU)")
    preset.add_argument("--smoke", action="store_const", const="smoke", dest="preset",
                        help="the smallest run that exercises every part (seconds)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"folder for solvers.json, the summaries and the plots "
                             f"(default: ./{DEFAULT_OUT})")
    parser.add_argument("--backends", nargs="+", metavar="NAME",
                        help="numpy, torch, torch-cuda, cupy, array_api_strict (default: "
                             "every available one but array_api_strict)")
    parser.add_argument("--methods", nargs="+", metavar="NAME",
                        help="restrict to these methods and the baselines eigh_batched, "
                             "eigh_loop (default: all)")
    parser.add_argument("--sizes", nargs="+", type=int, help="matrix sizes n")
    parser.add_argument("--batch", nargs="+", type=int,
                        help="batch sizes, used for every n given by --sizes")
    parser.add_argument("--p", nargs="+", type=int, dest="ps", help="root orders")
    parser.add_argument("--kappa", type=float, help="condition number of the sweep")
    parser.add_argument("--repeats", type=int, help="timed calls per contender at most")
    parser.add_argument("--dtype", choices=("float32", "float64"))
    parser.add_argument("--experiments", nargs="+",
                        choices=("sweep", "time_to_accuracy", "scaling"))
    parser.add_argument("--tta-backend", metavar="NAME",
                        help="backend of the time-to-accuracy and scaling experiments "
                             "(default: a GPU one if present, else torch)")
    add_thread_option(parser)
    parser.add_argument("--no-plots", action="store_true", help="write only JSON and tables")
    parser.set_defaults(run=_run_solvers, prog=parser.prog)


def solvers_config(args):
    """The preset named by ``args`` with the overrides applied; UsageError if invalid."""
    from .config import BASELINES, PRESETS, Config, all_methods

    base = PRESETS[args.preset or "full"]
    changes = {}
    for option, values in (("--sizes", args.sizes), ("--batch", args.batch),
                           ("--p", args.ps)):
        for value in values or ():
            at_least(value, 1, option)
    at_least(args.repeats, 1, "--repeats")
    at_least(args.threads, 0, "--threads")
    if args.kappa is not None and not 1 <= args.kappa < math.inf:
        raise UsageError(f"--kappa must be a finite number >= 1, got {args.kappa:g}")
    if args.sizes:
        changes["sizes"] = tuple(args.sizes)
        changes["batches"] = {n: tuple(args.batch) if args.batch
                              else _preset_batches(base, n, args.preset)
                              for n in args.sizes}
    elif args.batch:
        changes["batches"] = {n: tuple(args.batch) for n in base.sizes}
    for name in ("ps", "methods", "backends", "experiments"):
        if getattr(args, name):
            changes[name] = tuple(getattr(args, name))
    for name in ("kappa", "repeats", "dtype", "tta_backend", "threads"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    known = all_methods() + list(BASELINES)
    unknown = [m for m in args.methods or () if m not in known]
    if unknown:
        raise UsageError(f"unknown method {unknown[0]!r}; choose from " + ", ".join(known))
    return Config(**{**asdict(base), **changes})


def _preset_batches(base, n: int, preset: str | None) -> tuple:
    """Batch sizes for an n the preset does not list: the full run's memory-filling
    default, capped for --quick/--smoke at the preset's own largest batch (else
    ``--smoke --sizes 1`` would stack two million matrices)."""
    batches = base.batches_for(n)
    if preset is None or n in base.batches:
        return batches
    cap = max(b for listed in base.batches.values() for b in listed)
    return tuple(sorted({min(b, cap) for b in batches}))


def _run_solvers(args) -> int:
    from matroot.testing.backends import UnavailableError

    from .solvers import benchmark_targets, run

    config = solvers_config(args)
    out = writable_dir(args.out, "--out")
    if not args.no_plots:
        require_module(*_MATPLOTLIB)
    try:
        targets = benchmark_targets(config)
    except UnavailableError as err:
        raise UsageError(str(err)) from None
    if config.tta_backend is not None and config.tta_backend not in [t.name for t in targets]:
        raise UsageError(f"--tta-backend {config.tta_backend} is not among this run's "
                         f"backends ({', '.join(t.name for t in targets)})")
    doc = run(config, out, plots=not args.no_plots)
    for row in doc.get("sweep_summary", []):
        print(_summary_line(row))
    return 0


def _summary_line(row) -> str:
    from .sweep import format_ratio

    line = (f"{row['backend']:>10} n={row['n']:<5} b={row['batch']:<3} p={row['p']}: "
            f"fastest {row['fastest']}")
    if row["fastest_matmul_method"] is not None:
        line += (f"; best matmul method {row['fastest_matmul_method']} at "
                 f"{format_ratio(row['fastest_matmul_method_vs_eigh_batched'])}x batched "
                 f"eigh, {format_ratio(row['fastest_matmul_method_vs_eigh_loop'])}x "
                 "looped eigh")
    if row["eigh_in_matmuls"] is not None:
        line += f"; eigh = {format_ratio(row['eigh_in_matmuls'])} matmuls"
    return line


# ----------------------------------------------------------------------------- optim
def _configure_optim(parser) -> None:
    from .optim import DEFAULTS

    quick, full = DEFAULTS["quick"], DEFAULTS["full"]
    parser.add_argument("--quick", action="store_true",
                        help="a smaller model (widths 256-512) for a short CPU run")
    parser.add_argument("--backend", metavar="NAME",
                        help="torch, torch-cuda or numpy (default: torch if installed, "
                             "else numpy)")
    parser.add_argument("--method", default="auto",
                        help="inv_root method: auto or a registered one (default auto)")
    parser.add_argument("--block-size", type=int, help=f"largest block side (default "
                        f"{full['block_size']}, --quick {quick['block_size']})")
    parser.add_argument("--steps", type=int, help=f"timed steps per layout (default "
                        f"{full['steps']}, --quick {quick['steps']})")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                        help="torch: also time Shampoo.step under torch.compile (steps "
                             "without a root refresh) against eager, and its compile time; "
                             "BACKEND default inductor ('eager': dynamo's tracing only)")
    add_thread_option(parser)
    parser.add_argument("--memory", action="store_true",
                        help="print optimizer-state bytes per parameter (AdamW, matroot's "
                             "policies, Distributed Shampoo when installed) instead of timing")
    parser.add_argument("--out", metavar="JSON",
                        help="write the report as JSON here (and a .md table beside it)")
    parser.set_defaults(run=_run_optim, prog=parser.prog)


def _run_optim(args) -> int:
    from matroot.cli.contenders import all_methods
    from matroot.testing.backends import UnavailableError, discover, select_targets

    from .optim import DEFAULTS

    defaults = DEFAULTS["quick" if args.quick else "full"]
    block_size = at_least(args.block_size if args.block_size is not None
                          else defaults["block_size"], 1, "--block-size")
    steps = at_least(args.steps if args.steps is not None else defaults["steps"], 1,
                     "--steps")
    at_least(args.warmup, 0, "--warmup")
    at_least(args.threads, 0, "--threads")
    if args.method not in ("auto", *all_methods()):
        raise UsageError(f"unknown method {args.method!r}; choose from auto, "
                         + ", ".join(all_methods()))
    out = writable_file(args.out, "--out") if args.out else None
    backend = args.backend or ("torch" if discover(["torch"])[0].available else "numpy")
    try:
        target = select_targets([backend])[0]
    except UnavailableError as err:
        raise UsageError(str(err)) from None
    if target.backend not in ("torch", "numpy"):
        raise UsageError(f"--backend {backend}: the optimizer benchmark runs on torch or "
                         "numpy")
    if args.compile is not None and target.backend != "torch":
        raise UsageError(f"--compile times torch.compile: it needs a torch backend, "
                         f"not {backend}")

    if args.memory:
        from .optim_memory import format_memory_table, memory_report

        report = memory_report(block_size=args.block_size or 1024)
        table = format_memory_table(report)
        return _print_and_save(report, table, out)

    from matroot.cli.progress import Progress
    from matroot.cli.threads import thread_policy

    from .optim import format_table, run

    progress = Progress(args.warmup + steps)
    with thread_policy(args.threads) as threads:
        report = run(target, quick=args.quick, method=args.method, block_size=block_size,
                     steps=steps, warmup=args.warmup, progress=progress,
                     compile_backend=args.compile)
    progress.close()
    report["threads"] = threads
    return _print_and_save(report, format_table(report), out)


def _configure_polar(parser) -> None:
    from .polar import PARTS

    parser.add_argument("--quick", action="store_true", help="smaller stacks, fewer κ")
    parser.add_argument("--backend", default="torch", metavar="NAME",
                        help="numpy, torch, torch-cuda, jax, ... (default torch)")
    parser.add_argument("--part", nargs="+", choices=PARTS, default=list(PARTS),
                        help="run only these parts (default all)")
    add_thread_option(parser)
    parser.add_argument("--out", metavar="JSON",
                        help="write the report as JSON here (and a .md table beside it)")
    parser.set_defaults(run=_run_polar, prog=parser.prog)


def _run_polar(args) -> int:
    from matroot.cli.threads import thread_policy
    from matroot.testing.backends import UnavailableError, select_targets

    from .polar import format_table, run

    at_least(args.threads, 0, "--threads")
    out = writable_file(args.out, "--out") if args.out else None
    try:
        target = select_targets([args.backend])[0]
    except UnavailableError as err:
        raise UsageError(str(err)) from None
    with thread_policy(args.threads) as threads:
        report = run(target, quick=args.quick, parts=tuple(args.part))
    report["threads"] = threads
    return _print_and_save(report, format_table(report), out)


def _configure_launches(parser) -> None:
    parser.add_argument("--p", type=int, nargs="+", default=[2, 4], metavar="P",
                        help="root orders (default 2 4)")
    parser.add_argument("--n", type=int, default=384, help="matrix size (default 384)")
    parser.add_argument("--batch", type=int, default=8, help="stack size (default 8)")
    parser.add_argument("--kappa", type=float, default=1e4, help="κ (default 1e4)")
    parser.add_argument("--rtol", type=float, default=5e-3, help="target (default 5e-3)")
    parser.add_argument("--quick", action="store_true",
                        help="no adaptive-loop rows (the slowest to count)")
    add_thread_option(parser)
    parser.add_argument("--out", metavar="JSON",
                        help="write the report as JSON here (and a .md table beside it)")
    parser.set_defaults(run=_run_launches, prog=parser.prog)


def _run_launches(args) -> int:
    require_module("torch", "the dispatcher count", 'pip install "matroot[torch]"')
    from matroot.cli.threads import thread_policy

    from .launches import format_table, run

    at_least(args.threads, 0, "--threads")
    for value, name in ((args.n, "--n"), (args.batch, "--batch")):
        at_least(value, 1, name)
    out = writable_file(args.out, "--out") if args.out else None
    with thread_policy(args.threads) as threads:
        report = run(orders=tuple(args.p), n=args.n, batch=args.batch, kappa=args.kappa,
                     rtol=args.rtol, adaptive=not args.quick, quick=args.quick)
    report["threads"] = threads
    return _print_and_save(report, format_table(report), out)


def _print_and_save(report: dict, table: str, out) -> int:
    """Print a report's table; with ``--out``, write the JSON and a ``.md`` table beside it."""
    print(table)
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
        out.with_suffix(".md").write_text(table + "\n")
    return 0


# ---------------------------------------------------------------------- plots, report
def _results(args) -> tuple[dict, Path]:
    """The solver benchmark's document named on the command line, and the output folder."""
    from .solvers import SCHEMA

    path = Path(args.results)
    if not path.is_file():
        raise UsageError(f"no such results file: {path}")
    try:
        doc = json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise UsageError(f"{path} is not a readable JSON file ({err})") from None
    # Anything else would draw nothing and still exit 0.
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise UsageError(f"{path} is not a solver benchmark's results (schema {found!r}, "
                         f"expected {SCHEMA!r}): give the solvers.json that "
                         "`python -m bench solvers` wrote")
    return doc, writable_dir(args.out or str(path.parent), "--out")


def _run_plots(args) -> int:
    doc, out = _results(args)
    require_module(*_MATPLOTLIB)
    from .plots import make_plots

    for png in make_plots(doc, out):
        print(f"wrote {png}")
    return 0


def _run_report(args) -> int:
    doc, out = _results(args)
    from .report import write_summaries

    for written in write_summaries(doc, out):
        print(f"wrote {written}")
    return 0
