"""``matroot demo``: every method on every backend, on Shampoo-like factors.

The measuring is :mod:`matroot.cli.demo_run`'s; this module parses and checks the
options, applies the thread policy, shows progress and writes the outputs.
"""

from __future__ import annotations

import math
import time

from .common import (
    UsageError,
    add_target_options,
    add_thread_option,
    at_least,
    names,
    require_module,
    targets_from,
    writable_file,
)
from .contenders import all_methods, method_supports

DESCRIPTION = ("Solve a stack of Shampoo-like factors (Gram matrices of random low-rank "
               "gradients plus a ridge) with every method on every backend; print time, "
               "error against a float64 eigh oracle, iterations and the speed ratio "
               "against batched eigh; write a plot.")
DEFAULT_PLOT = "matroot-demo.png"
QUICK = {"batch": 4, "size": 24, "repeats": 1}
FULL = {"batch": 16, "size": 128, "repeats": 3}


def configure(parser) -> None:
    add_target_options(parser, "every installed backend but jax, whose eager first "
                               "calls time its compiler; --backend jax runs it")
    add_thread_option(parser)
    parser.add_argument("--method", action="append", metavar="NAME",
                        help="a method to run (repeatable; default: every registered one)")
    parser.add_argument("--p", type=float, default=4.0, help="root order (default 4)")
    parser.add_argument("--batch", type=int, help=f"matrices in the stack (default "
                        f"{FULL['batch']}, --quick {QUICK['batch']})")
    parser.add_argument("--size", type=int, help=f"matrix size n (default {FULL['size']}, "
                        f"--quick {QUICK['size']})")
    parser.add_argument("--eps", type=float, default=1e-5,
                        help="ridge added to every factor (default 1e-5)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--repeats", type=int, help=f"timed calls per method after a "
                        f"warm-up (default {FULL['repeats']}, --quick {QUICK['repeats']})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="a tiny problem, for a smoke test in seconds")
    parser.add_argument("--out", default=DEFAULT_PLOT, metavar="PNG",
                        help=f"where to write the plot (default ./{DEFAULT_PLOT})")
    parser.add_argument("--no-plot", action="store_true", help="do not write the plot")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.set_defaults(run=run, prog=parser.prog)


def _checked(args) -> dict:
    """Every option checked before any work; the demo's keyword arguments."""
    sizes = QUICK if args.quick else FULL
    options = {name: getattr(args, name) if getattr(args, name) is not None else sizes[name]
               for name in ("batch", "size", "repeats")}
    for name, value in options.items():
        at_least(value, 1, f"--{name}")
    at_least(args.threads, 0, "--threads")
    if not 0 < args.p < math.inf:
        raise UsageError(f"--p must be a finite number > 0, got {args.p:g}")
    if not 0 < args.eps < math.inf:
        raise UsageError(f"--eps must be a finite number > 0 (the factors are singular "
                         f"without a ridge), got {args.eps:g}")
    methods = names(args.method)
    unknown = [m for m in methods or () if m not in all_methods()]
    if unknown:
        raise UsageError(f"unknown method {unknown[0]!r}; choose from "
                         + ", ".join(all_methods()))
    p = int(args.p) if float(args.p).is_integer() else args.p
    unsupported = [m for m in methods or () if not method_supports(m, p)]
    if unsupported:
        raise UsageError(f"--method {unsupported[0]} does not take --p {args.p:g}; methods "
                         "that do: " + ", ".join(m for m in all_methods()
                                                 if method_supports(m, p)))
    if args.json:
        writable_file(args.json, "--json")
    if not args.no_plot:
        writable_file(args.out, "--out")
        require_module("matplotlib", "the plot", 'pip install "matroot[bench]"')
    if methods is None:
        methods = [m for m in all_methods() if method_supports(m, p)]
    return dict(options, methods=methods, p=args.p, eps=args.eps, dtype=args.dtype,
                seed=args.seed)


def run(args) -> int:
    options = _checked(args)
    targets = targets_from(args)
    if not args.backend:
        # Eager JAX compiles every operation on its first use: the demo's one
        # warm-up call would time the compiler, not the method (see docs/jax.rst).
        targets = [t for t in targets if t.backend != "jax"] or targets
    from .demo_run import format_table, run_demo, write_json, write_plot
    from .progress import Progress
    from .threads import thread_policy

    start = time.perf_counter()
    methods = options["methods"]
    progress = Progress(len(targets) * (len(methods) + 1))
    with thread_policy(args.threads) as threads:
        report = run_demo(targets, progress=progress, **options)
    progress.close()
    report["threads"] = threads
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    if not args.no_plot:
        write_plot(report, args.out)
        print(f"wrote {args.out}")
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0

