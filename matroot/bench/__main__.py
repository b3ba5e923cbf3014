"""``python -m matroot.bench SUBCOMMAND [options]``: run one of the benchmarks.

Subcommands: ``solvers`` (:mod:`matroot.bench.solvers`) and ``optim``
(:mod:`matroot.bench.optim`); the options are the subcommand's own.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "solvers": "matroot.bench.solvers",
    "optim": "matroot.bench.optim",
}


def main(argv=None) -> int:
    """Dispatch ``argv[0]`` to its benchmark's ``main(argv[1:])``.

    Examples
    --------
    >>> from matroot.bench.__main__ import main
    >>> main(["--help"])  # doctest: +ELLIPSIS
    usage: python -m matroot.bench {solvers,optim} [options]
    ...
    0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m matroot.bench {" + ",".join(SUBCOMMANDS) + "} [options]"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        print("  solvers  inverse-root solvers vs batched and looped eigh")
        print("  optim    the Shampoo optimizer step")
        print("run 'python -m matroot.bench SUBCOMMAND --help' for its options")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"unknown benchmark {name!r}; {usage}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(SUBCOMMANDS[name])
    except ModuleNotFoundError as err:
        if err.name != SUBCOMMANDS[name]:
            raise
        print(f"the {name!r} benchmark ({SUBCOMMANDS[name]}) is not installed in this "
              "version of matroot", file=sys.stderr)
        return 2
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
