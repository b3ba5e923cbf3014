"""The common return type of the solvers."""

from __future__ import annotations

from typing import NamedTuple

from .._typing import Array
from ..certify.verify import RootCheck



class SolverOutput(NamedTuple):
    """What every solver returns for a ``(b, n, n)`` stack.

    ``root`` is the inverse root of the *scaled* stack the solver was given;
    the other fields are per-matrix arrays of shape ``(b,)``. ``matmuls`` counts
    the n×n products each matrix needed (work skipped after it froze excluded).
    ``lambda_max`` is the largest eigenvalue of the given stack where the solver
    computed it (evd), else None. ``check`` is the solver's own check of its
    root where it can bound its error without products (evd, from its
    eigenvalues), else None: :func:`matroot.certify.verify.verify_root` then checks it.
    ``converged`` is the solver's stop verdict, one input of
    :func:`matroot.certify.accuracy.is_converged`.
    """

    root: Array
    residual: Array
    iterations: Array
    converged: Array
    matmuls: Array
    lambda_max: Array | None = None
    check: RootCheck | None = None
