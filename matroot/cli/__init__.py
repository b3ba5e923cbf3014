"""The ``matroot`` command line: ``demo`` (the default), ``info``, ``bench``, ``plan``.

``bench solvers``, ``bench optim`` and ``plan`` hand their remaining arguments
to the ``main(argv)`` of the module that implements them, imported only when
asked for, so this module stays importable without their dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

import matroot

from .backends import UnavailableError, select_targets

#: Subcommands implemented elsewhere: command words -> (module, what it is).
FORWARDED = {
    ("bench", "solvers"): ("matroot.bench.solvers", "the solver benchmark"),
    ("bench", "optim"): ("matroot.bench.optim", "the optimizer benchmark"),
    ("plan",): ("matroot.optim.plan", "the distributed sharding planner"),
}
DEFAULT_PLOT = "matroot-demo.png"
_QUICK = {"batch": 4, "size": 24, "repeats": 1}
_FULL = {"batch": 16, "size": 128, "repeats": 3}


def _fail(message: str, prefix: str = "matroot: error") -> int:
    print(f"{prefix}: {message}", file=sys.stderr)
    return 2


def _names(values):
    """``--backend a,b --backend c`` -> ["a", "b", "c"]; None when not given."""
    if not values:
        return None
    return [name for value in values for name in value.split(",") if name.strip()]


def _add_target_options(parser):
    parser.add_argument(
        "--backend", action="append", metavar="NAME",
        help="numpy, torch, array_api_strict or cupy; repeat or comma-separate for "
             "several (default: every installed backend)")
    parser.add_argument(
        "--device", metavar="NAME",
        help="cpu, cuda or cuda:N (default: every device of each backend)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="matroot",
        description="Batched matrix inverse p-th roots. Without a command, runs the demo.")
    parser.add_argument("--version", action="version",
                        version=f"matroot {matroot.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="every method on every backend, on Shampoo-like factors (default)",
        description="Solve a stack of Shampoo-like factors (Gram matrices of random "
                    "low-rank gradients plus a ridge) with every method on every backend; "
                    "print time, error against a float64 eigh oracle, iterations and the "
                    "speed ratio against batched eigh; write a plot.")
    _add_target_options(demo)
    demo.add_argument("--method", action="append", metavar="NAME",
                      help="a method to run (repeatable; default: all of "
                           + ", ".join(_solver_names()) + ")")
    demo.add_argument("--p", type=float, default=4.0, help="root order (default 4)")
    demo.add_argument("--batch", type=int, help=f"matrices in the stack "
                      f"(default {_FULL['batch']}, --quick {_QUICK['batch']})")
    demo.add_argument("--size", type=int, help=f"matrix size n "
                      f"(default {_FULL['size']}, --quick {_QUICK['size']})")
    demo.add_argument("--eps", type=float, default=1e-5,
                      help="ridge added to every factor (default 1e-5)")
    demo.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    demo.add_argument("--repeats", type=int, help=f"timed calls per method after a "
                      f"warm-up (default {_FULL['repeats']}, --quick {_QUICK['repeats']})")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--quick", action="store_true",
                      help="a tiny problem, for a smoke test in seconds")
    demo.add_argument("--out", default=DEFAULT_PLOT, metavar="PNG",
                      help=f"where to write the plot (default ./{DEFAULT_PLOT})")
    demo.add_argument("--no-plot", action="store_true", help="do not write the plot")
    demo.add_argument("--json", metavar="PATH", help="also write the results as JSON")

    info = commands.add_parser(
        "info", help="backends, devices, versions, and which methods and precisions work",
        description="List the backends and devices found, their versions, and try every "
                    "method in every precision on each to show what is supported.")
    _add_target_options(info)
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.add_argument("--save", metavar="PATH", help="also write the JSON to PATH")

    bench = commands.add_parser("bench", help="benchmarks: 'bench solvers ...' or "
                                              "'bench optim ...' (arguments go to them)")
    bench.add_argument("kind", choices=("solvers", "optim"))
    commands.add_parser("plan", help="the distributed sharding planner "
                                     "(arguments go to it)")
    return parser


def _solver_names():
    from matroot.solvers import SOLVERS

    return list(SOLVERS)


def forward(words: tuple, argv: list) -> int:
    """Import the module behind ``words`` and run its ``main(argv)``."""
    module_name, what = FORWARDED[words]
    command = "matroot " + " ".join(words)
    prefix = f"{command}: error"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            return _fail(f"{what} is not part of this matroot ({matroot.__version__}); "
                         f"module {module_name} is missing", prefix)
        return _fail(f"{what} needs the package {missing!r}, which is not installed",
                     prefix)
    entry = getattr(module, "main", None)
    if entry is None:
        return _fail(f"{module_name} has no main(argv)", prefix)
    code = entry(argv)
    return 0 if code is None else int(code)


def run_demo_command(args) -> int:
    from matroot.solvers import SOLVERS

    from .demo import format_table, run_demo, write_json, write_plot

    sizes = _QUICK if args.quick else _FULL
    batch = args.batch if args.batch is not None else sizes["batch"]
    size = args.size if args.size is not None else sizes["size"]
    repeats = args.repeats if args.repeats is not None else sizes["repeats"]
    for name, value in (("--batch", batch), ("--size", size), ("--repeats", repeats)):
        if value < 1:
            return _fail(f"{name} must be a positive integer, got {value}")
    if not args.p > 0:
        return _fail(f"--p must be > 0, got {args.p:g}")
    if not args.eps > 0:
        return _fail(f"--eps must be > 0 (the factors are singular without a ridge), "
                     f"got {args.eps:g}")
    methods = _names(args.method)
    if methods is not None:
        unknown = [m for m in methods if m not in SOLVERS]
        if unknown:
            return _fail(f"unknown method {unknown[0]!r}; choose from "
                         + ", ".join(SOLVERS))
    try:
        targets = select_targets(_names(args.backend), args.device)
    except UnavailableError as err:
        return _fail(str(err))

    start = time.perf_counter()
    report = run_demo(targets, methods=methods, p=args.p, batch=batch, size=size,
                      eps=args.eps, dtype=args.dtype, repeats=repeats, seed=args.seed,
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    if not args.no_plot:
        try:
            write_plot(report, args.out)
        except ModuleNotFoundError as err:
            print(f"no plot: {err.name} is not installed (pip install matplotlib)")
        else:
            print(f"wrote {args.out}")
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


def run_info_command(args) -> int:
    from .info import collect, format_info

    try:
        targets = select_targets(_names(args.backend), args.device) \
            if args.backend or args.device else None
    except UnavailableError as err:
        return _fail(str(err))
    data = collect(targets=targets)
    print(json.dumps(data, indent=2) if args.json else format_info(data))
    if args.save:
        with open(args.save, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
    return 0


def main(argv=None) -> int:
    """Run the command line; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"]:
        return forward(("plan",), argv[1:])
    if argv[:1] == ["bench"] and len(argv) > 1 and argv[1] in ("solvers", "optim"):
        return forward(("bench", argv[1]), argv[2:])
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help",
                                                                "--version")):
        argv = ["demo", *argv]
    args = build_parser().parse_args(argv)
    try:
        if args.command == "info":
            return run_info_command(args)
        return run_demo_command(args)
    except KeyboardInterrupt:
        return 130
