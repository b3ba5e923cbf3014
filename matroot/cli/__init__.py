"""The ``matroot`` command line: one dispatcher for every verb.

``matroot [demo]``, ``matroot info`` and ``matroot plan``. Each verb lives in a module
of this package with a ``configure(parser)`` that declares its options and the function
that runs it; every verb checks all of its input before doing any work, and bad input is
one line on stderr with exit code 2. Heavy imports happen inside the verbs, so
``matroot --help`` is instant. The measuring the demo does (``demo_run``, ``contenders``,
``timing``, ``threads``, ``progress``) is shared with the benchmarks, which are not
installed: they run from a checkout of the repository (``python -m bench --help``).
"""

from __future__ import annotations

import sys

import matroot

from . import demo, info, plan
from .common import OneLineParser, UsageError, fail

__all__ = ["main", "build_parser", "VERBS"]

#: The top-level verbs, in the order ``matroot --help`` lists them.
VERBS = ("demo", "info", "plan")
#: Where ``matroot bench``, a verb of earlier versions, went.
BENCH_MOVED = ("the benchmarks are not installed with the package: from a checkout of "
               "the repository, run `python -m bench --help`")


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="matroot",
        description="Batched matrix inverse p-th roots. Without a command, runs the demo.")
    parser.add_argument("--version", action="version", version=f"matroot {matroot.__version__}")
    verbs = parser.add_subparsers(dest="command", metavar="COMMAND",
                                  parser_class=OneLineParser)
    demo.configure(verbs.add_parser(
        "demo", help="every method on every backend, on Shampoo-like factors (default)",
        description=demo.DESCRIPTION))
    info.configure(verbs.add_parser(
        "info", help="backends, devices, versions, and which methods and precisions work",
        description=info.DESCRIPTION))
    plan.configure(verbs.add_parser(
        "plan", help="size a cluster for sharded Shampoo from parameter shapes",
        description=plan.DESCRIPTION))
    return parser


def main(argv=None) -> int:
    """Run the command line; returns the exit code.

    Examples
    --------
    >>> from matroot.cli import main
    >>> main(["demo", "--batch", "0"])
    2
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["demo", *argv]
    if argv[0] == "bench":
        return fail("matroot", BENCH_MOVED)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, --version, or a one-line argparse error
        return int(done.code or 0)
    try:
        return int(args.run(args) or 0)
    except UsageError as err:
        return fail(args.prog, str(err))
    except ModuleNotFoundError as err:
        return fail(args.prog, f"needs the package {err.name!r}, which is not installed")
    except KeyboardInterrupt:
        return 130
