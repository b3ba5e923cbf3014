"""``a^(-1/p)`` for ``p = 2^k`` by k square-root stages, shared by the coupled
square-root iterations (:mod:`~matroot.solvers.newton_db`, :mod:`~matroot.solvers.minimax`).

Stage j takes the square root of the previous stage's square root, so its
condition number is the square root of the previous one; the last stage's
inverse square root is the answer. p = 1 squares ``a^(-1/2)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple
from collections.abc import Callable

from .. import _xp
from .._typing import Array
from ._result import SolverOutput


class StageOutcome(NamedTuple):
    """One stage's ``Y ≈ c^(1/2)``, ``Z ≈ c^(-1/2)`` of its input ``c``, and per-matrix
    diagnostics (the residual already weighted by what the stage contributes)."""

    y: Array
    z: Array
    residual: Array
    iterations: Array
    converged: Array
    matmuls: Array


def stage_count(p: int) -> int:
    """k for ``p = 2^k``; 1 for p = 1 (whose inverse square root is squared)."""
    return max(1, round(math.log2(p)))


def square_root_stages(a, p: int, run_stage: Callable, *, square: Callable,
                       rescale: Callable | None = None) -> SolverOutput:
    """Run ``run_stage(current, stage, stages) -> StageOutcome`` for each stage.

    Parameters
    ----------
    a : array, shape (b, n, n)
        The scaled stack.
    p : int
        1 or a power of two.
    run_stage : callable
        Computes one square root; ``current`` is ``a`` for stage 0, then the
        previous stage's ``Y`` (divided by ``rescale(Y)`` when given).
    square : callable
        The product that squares ``Z`` for p = 1 (one more matmul).
    rescale : callable, optional
        ``rescale(Y) -> (b,)`` positive per-matrix scales that put the next
        stage's spectrum back into (0, 1]; undone in the returned root.

    Returns
    -------
    SolverOutput
        Residual: the worst stage's; iterations and matmuls: summed over stages.
    """
    xp = _xp.array_namespace(a)
    dev = _xp.device_of(a)
    b = a.shape[0]
    residual = xp.zeros((b,), dtype=a.dtype, device=dev)
    iterations = xp.zeros((b,), dtype=xp.int32, device=dev)
    matmuls = xp.zeros((b,), dtype=xp.int32, device=dev)
    converged = xp.ones((b,), dtype=xp.bool, device=dev)
    stages = stage_count(p)
    # Invariant: the answer is (factor * current)^(-1/2).
    current, factor = a, None
    for stage in range(stages):
        outcome = run_stage(current, stage, stages)
        residual = xp.maximum(residual, outcome.residual)
        iterations = iterations + outcome.iterations
        matmuls = matmuls + outcome.matmuls
        converged = converged & outcome.converged
        current = outcome.y
        if rescale is not None and stage + 1 < stages:
            c = rescale(current)
            current = current / c[:, None, None]
            factor = c if factor is None else xp.sqrt(factor) * c
    if p == 1:
        return SolverOutput(square(outcome.z, outcome.z), residual, iterations, converged,
                            matmuls + 1)
    root = outcome.z if factor is None else outcome.z / xp.sqrt(factor)[:, None, None]
    return SolverOutput(root, residual, iterations, converged, matmuls)
