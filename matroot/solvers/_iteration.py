"""The shared loop of the iterative solvers: per-matrix freezing, batched stop checks.

Each matrix of a stack stops on its own once its residual is at most ``tol``, once
the residual stalls at the rounding floor (it fell below ``sqrt(tol)`` and then did
not halve in a step: quadratic convergence has ended, and more steps only add
rounding error), or once it turns non-finite. Its iterate is frozen, so it does
not degrade while the others go on. The loop asks the device whether any matrix
is still active only every ``check_every`` steps, which bounds the host syncs;
under ``jax.jit`` it is a device-side ``lax.while_loop``
(:func:`matroot._xp.bounded_loop`) with the same per-matrix freezing and no host
reads.
"""

from __future__ import annotations

from typing import NamedTuple
from collections.abc import Callable

from .. import _xp
from .._typing import Array


class IterationOutcome(NamedTuple):
    """Final iterate and per-matrix diagnostics of :func:`iterate_frozen`."""

    state: tuple
    residual: Array
    iterations: Array
    converged: Array


def iterate_frozen(
    state: tuple,
    step: Callable,
    residual_of: Callable,
    *,
    tol: float,
    max_iter: int,
    check_every: int,
    stall_level: float | None = None,
) -> IterationOutcome:
    """Run ``state = step(state)`` per matrix until its residual is at most ``tol``.

    Parameters
    ----------
    state : tuple of arrays, each (b, n, n)
        The coupled iterates.
    step : callable
        ``step(state, k) -> (residual_of_state, next_state)`` for step number ``k``
        (a Python int, or from ``k = 1`` on a traced scalar under ``jax.jit``);
        the residual belongs to the *incoming* state, so a product it shares with
        the update is formed once.
    residual_of : callable
        ``residual_of(state) -> residual``, used only when ``max_iter`` is hit.
    tol : float
        Per-matrix stop threshold; 0 runs exactly ``max_iter`` steps. A matrix
        counts as converged when it met ``tol`` or stalled at the rounding floor.
    max_iter : int
        Step cap.
    check_every : int
        Steps between host-side checks for an early exit.
    stall_level : float, optional
        Residual below which a step that does not halve it counts as a stall;
        default ``sqrt(tol)``. A 16-bit phase whose rounding floor lies far above
        ``tol`` passes a multiple of its unit roundoff.
    """
    xp = _xp.array_namespace(state[0])
    b = state[0].shape[0]
    dev = _xp.device_of(state[0])
    traced = _xp.is_traced(state[0])
    if stall_level is None:
        stall_level = tol ** 0.5

    def advance(carry, k):
        state, residual, iterations, active, stalled = carry
        res, new_state = step(state, k)
        previous = residual
        residual = xp.where(active, res, residual)
        still = active & xp.isfinite(res)
        if tol > 0:
            stalled = stalled | (still & (res <= stall_level) & (res > previous / 2))
            still = still & (res > tol) & ~stalled
        state = tuple(_xp.batched_where(still, n, o) for n, o in zip(new_state, state))
        return state, residual, iterations + xp.astype(still, xp.int32), still, stalled

    carry = (tuple(state),
             xp.full((b,), float("inf"), dtype=state[0].dtype, device=dev),
             xp.zeros((b,), dtype=xp.int32, device=dev),
             xp.ones((b,), dtype=xp.bool, device=dev),
             xp.zeros((b,), dtype=xp.bool, device=dev))
    state, residual, iterations, active, stalled = _xp.bounded_loop(
        advance, carry, max_iter=max_iter, running=lambda c: xp.any(c[3]),
        check_every=check_every, traced=traced)
    # Matrices still active hit max_iter: their residual is of the state before
    # the last step, so form the final state's (unconditionally under tracing).
    if traced or bool(xp.any(active)):
        residual = xp.where(active, residual_of(state), residual)
    finite = xp.isfinite(residual)
    converged = finite & ((residual <= tol) | stalled) if tol > 0 else xp.zeros_like(active)
    return IterationOutcome(state, residual, iterations, converged)
