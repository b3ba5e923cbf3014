"""``python -m bench``: the one entry point of matroot's benchmarks, from the repository root.

``python -m bench solvers|optim|polar|launches|plots|report [options]`` runs a
benchmark verb (:mod:`bench.cli`); ``python -m bench NAME [args]`` runs the script
``bench/NAME.py`` (an experiment of one issue) with its own options;
``python -m bench --help`` lists both.
"""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

from matroot.cli.common import OneLineParser, UsageError, fail

from . import cli

HERE = Path(__file__).resolve().parent
#: The experiment scripts ``python -m bench NAME`` runs: every bench/*.py that is not
#: a module of the verbs.
SCRIPTS = ("dash_reference", "eigenbasis_refresh", "gpu_syncs", "launches_step",
           "muon_char", "muon_step", "overheads", "overheads_profile", "polar_fit",
           "soap_char")


def _summary(name: str) -> str:
    """The first sentence of a script's docstring, for ``--help``."""
    doc = ast.get_docstring(ast.parse((HERE / f"{name}.py").read_text(encoding="utf-8")))
    paragraph = (doc or name).split("\n\n")[0].replace("\n", " ")
    return paragraph.split(". ")[0].rstrip(".")


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m bench",
                           description="matroot's benchmarks, run from the repository root. "
                                       "Results go where --out says.",
                           epilog="bash bench/gpu_check.sh runs the GPU checks (the suite's "
                                  "GPU tests and these benchmarks) on a CUDA machine.")
    verbs = cli.configure(parser)
    for name in SCRIPTS:
        verbs.add_parser(name, help=f"script: {_summary(name)}", add_help=False)
    return parser


def run_script(name: str, args: list[str]) -> int:
    """Run ``bench/NAME.py`` as ``__main__`` with ``args``; its folder and the repository
    root on ``sys.path``, as ``python bench/NAME.py`` from the root would have them."""
    saved = sys.argv[:], sys.path[:]
    sys.argv = [f"bench/{name}.py", *args]
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    try:
        runpy.run_path(str(HERE / f"{name}.py"), run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
    return 0


def main(argv=None) -> int:
    """Run a benchmark verb or script; returns the exit code.

    Examples
    --------
    >>> from bench.__main__ import main
    >>> main(["optim", "--steps", "0"])
    2
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SCRIPTS:
        return run_script(argv[0], argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, or a one-line argparse error
        return int(done.code or 0)
    try:
        return int(args.run(args) or 0)
    except UsageError as err:
        return fail(args.prog, str(err))
    except ModuleNotFoundError as err:
        return fail(args.prog, f"needs the package {err.name!r}, which is not installed")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
