"""One file per method; each solver maps a scaled ``(b, n, n)`` stack to a SolverOutput.

A solver receives a regularised symmetric stack whose spectrum lies in (0, 1]
(up to the λmax estimate's margin) and returns the inverse root of that scaled
stack; :mod:`matroot.roots` undoes the scaling.
"""

from .chebyshev import chebyshev
from .coupled_newton import coupled_newton
from .evd import evd
from .minimax import minimax
from .newton_db import newton_db
from ._result import SolverOutput

SOLVERS = {
    "evd": evd,
    "newton_db": newton_db,
    "coupled_newton": coupled_newton,
    "chebyshev": chebyshev,
    "minimax": minimax,
}

__all__ = ["SOLVERS", "SolverOutput", "evd", "newton_db", "coupled_newton", "chebyshev",
           "minimax"]
