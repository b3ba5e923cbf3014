"""The common return type of the solvers."""

from __future__ import annotations

from typing import NamedTuple

from .._typing import Array


class SolverOutput(NamedTuple):
    """What every solver returns for a ``(b, n, n)`` stack.

    ``root`` is the inverse root of the *scaled* stack the solver was given;
    the other fields are per-matrix arrays of shape ``(b,)``. ``matmuls`` counts
    the n×n products each matrix needed (work skipped after it froze excluded).
    """

    root: Array
    residual: Array
    iterations: Array
    converged: Array
    matmuls: Array
