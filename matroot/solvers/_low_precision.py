"""A 16-bit phase followed by working-precision polishing steps, for the coupled iterations.

With 16-bit matmul operands (``matmul_dtype``) an iteration's residual bottoms
out near a multiple of the operands' unit roundoff u, and more 16-bit steps only
add rounding error. So the iteration runs in two phases: the 16-bit phase stops
once the residual reaches ``floor·u`` (or stalls below ``stall_ratio·floor·u``),
then a few steps with every product in the working dtype finish. Without
16-bit operands there is one phase. The floor depends on how the solver forms
its residual, so each solver states its own measured :class:`LowPrecisionPhase`.
"""

from __future__ import annotations

from typing import NamedTuple
from collections.abc import Callable

from .. import _xp
from ._iteration import IterationOutcome, iterate_frozen
from .._typing import Array
from ..certify.accuracy import unit_roundoff


class LowPrecisionPhase(NamedTuple):
    """Where a solver's 16-bit phase stops, in units of the operands' unit roundoff u."""

    #: The phase stops at a residual of ``floor·u`` ...
    floor: float
    #: ... or once it stalls below ``stall_ratio·floor·u``.
    stall_ratio: float


class PhasedOutcome(NamedTuple):
    """Outcome of both phases (``iterations`` summed) and the steps of each phase."""

    outcome: IterationOutcome
    main_iterations: Array
    polish_iterations: Array


def run_phases(start: tuple, step: Callable, residual_of: Callable, *, matmul, tol: float,
               main_steps: int, polish_steps: int, check_every: int,
               phase: LowPrecisionPhase, residual_scale: float = 1.0) -> PhasedOutcome:
    """Iterate ``start`` with a (16-bit) main phase and, for 16-bit operands, a polish.

    Parameters
    ----------
    start : tuple of arrays
        The initial coupled iterates.
    step : callable
        ``step(state, k, main) -> (residual_of_state, advance)``: step ``k``
        (counted from 0 within its phase; a Python int for k = 0, traced after
        it under ``jax.jit``) of the main phase (``main=True``, whose
        products may round to 16 bits when ``matmul`` has an operand dtype) or of
        the polish (``main=False``: working precision throughout); ``advance()``
        forms the next state, as in
        :func:`~matroot.solvers._iteration.iterate_frozen`.
    residual_of : callable
        As in :func:`~matroot.solvers._iteration.iterate_frozen`.
    matmul : matroot._xp.Matmul
        Its ``operand_dtype`` decides whether there is a 16-bit phase.
    tol : float
        The final residual target; 0 runs fixed step counts (one polish step).
    main_steps, polish_steps : int
        Step caps of the phases (``main_steps`` may be 0).
    check_every : int
        Steps between host-side early-exit checks.
    phase : LowPrecisionPhase
        The solver's 16-bit floor.
    residual_scale : float, optional
        As in :func:`~matroot.solvers._iteration.iterate_frozen`.
    """
    low = matmul.operand_dtype is not None

    def run(state, *, main, tol, max_iter, stall_level=None):
        def one_step(state, k):
            return step(state, k, main)

        return iterate_frozen(state, one_step, residual_of, tol=tol, max_iter=max_iter,
                              check_every=check_every, stall_level=stall_level,
                              residual_scale=residual_scale)

    xp = _xp.array_namespace(start[0])
    zero = xp.zeros((start[0].shape[0],), dtype=xp.int32, device=_xp.device_of(start[0]))
    if main_steps > 0:
        u = unit_roundoff(xp, matmul.operand_dtype) if low else 0.0
        tol_main = max(tol, phase.floor * u) if low and tol > 0 else tol
        outcome = run(start, main=True, tol=tol_main, max_iter=main_steps,
                      stall_level=phase.stall_ratio * tol_main if low else None)
    else:
        outcome = IterationOutcome(start, None, zero, None)
    if not low:
        return PhasedOutcome(outcome, outcome.iterations, zero)
    polish = run(outcome.state, main=False, tol=tol,
                 max_iter=polish_steps if tol > 0 else 1)
    total = polish._replace(iterations=outcome.iterations + polish.iterations)
    return PhasedOutcome(total, outcome.iterations, polish.iterations)
