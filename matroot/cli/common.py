"""What every ``matroot`` verb shares: one-line usage errors, target and thread options,
and the checks that run before any work starts."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import matroot
from matroot.testing.backends import UnavailableError, select_targets

from .threads import DEFAULT_THREADS

__all__ = ["UsageError", "OneLineParser", "add_target_options", "add_thread_option",
           "targets_from", "require_module", "writable_file", "writable_dir", "at_least",
           "names", "fail"]


class UsageError(Exception):
    """Bad input to a verb: printed as one line, exit code 2, before any work."""


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line (``matroot demo: error: ...``), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def names(values) -> list[str] | None:
    """``--backend a,b --backend c`` -> ["a", "b", "c"]; None when not given."""
    if not values:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def add_target_options(parser, what: str = "every installed backend") -> None:
    parser.add_argument(
        "--backend", action="append", metavar="NAME",
        help="numpy, torch, torch-cuda, array_api_strict or cupy; repeat or "
             f"comma-separate for several (default: {what})")
    parser.add_argument("--device", metavar="NAME",
                        help="cpu, cuda or cuda:N (default: every device of each backend)")


def add_thread_option(parser) -> None:
    parser.add_argument(
        "--threads", type=int, default=DEFAULT_THREADS, metavar="N",
        help=f"threads per library: BLAS, OpenMP, torch (default {DEFAULT_THREADS}: "
             "steady timings on a shared machine, as the committed results used; "
             "0 = the libraries' own default, all cores)")


def targets_from(args) -> list:
    """The targets ``--backend``/``--device`` name (every available one by default)."""
    try:
        return select_targets(names(args.backend), args.device)
    except UnavailableError as err:
        raise UsageError(str(err)) from None


def require_module(module: str, purpose: str, install: str) -> None:
    """UsageError unless ``module`` can be imported."""
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{purpose} needs {module}, which is not installed ({install}; "
                         f"or pass the option that skips it)")


def writable_file(path: str, option: str) -> Path:
    """``path`` as a Path whose folder exists and is writable; UsageError otherwise."""
    target = Path(path).expanduser()
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"{option} {path} is a folder; give a file name")
    if not folder.is_dir():
        raise UsageError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {path}: the folder {folder} is not writable")
    return target


def writable_dir(path: str, option: str) -> Path:
    """``path`` as a writable folder outside the installed package, created if need be."""
    folder = Path(path).expanduser().resolve()
    package = Path(matroot.__file__).resolve().parent
    if folder == package or package in folder.parents:
        raise UsageError(f"{option} {path} is inside the installed matroot package; "
                         "choose a folder of your own")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{option} {path} is not a writable folder ({err.strerror})") from None
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {path} is not a writable folder")
    return folder


def at_least(value, minimum, option: str):
    if value is not None and value < minimum:
        kind = "a positive integer" if minimum == 1 else f">= {minimum}"
        raise UsageError(f"{option} must be {kind}, got {value}")
    return value


def fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
