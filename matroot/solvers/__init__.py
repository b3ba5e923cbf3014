"""One file per method; each solver maps a scaled ``(b, n, n)`` stack to a SolverOutput.

A solver receives a regularised symmetric stack whose spectrum lies in (0, 1]
(up to the λmax estimate's margin) and returns the inverse root of that scaled
stack; :mod:`matroot.roots.api` undoes the scaling. Each solver module declares a
``SPEC`` (:class:`~matroot.solvers.registry.SolverSpec`); the registry line
below makes it known to validation, ``auto``, ``matroot info``, the docs and
the benchmark.
"""

from . import chebyshev, coupled_newton, evd, minimax, newton_db
from ._result import SolverOutput
from .registry import SOLVERS, SolverSpec, get_solver, register_solver, solver_names

for _module in (evd, newton_db, coupled_newton, chebyshev, minimax):
    register_solver(_module.SPEC)

__all__ = ["SOLVERS", "SolverOutput", "SolverSpec", "get_solver", "register_solver",
           "solver_names"]
