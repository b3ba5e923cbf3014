"""The shared loop of the iterative solvers: per-matrix freezing, batched stop checks.

Each matrix of a stack stops on its own once its residual is at most ``tol``, once
the residual stalls at the rounding floor (it fell below ``sqrt(tol)``, every
direction has converged, and then it did not halve in a step: quadratic
convergence has ended, and more steps only add rounding error), or once it turns
non-finite. "Every direction" is read from the residual's unnormalised Frobenius
norm ``√n·residual ≥ ‖I − M‖₂``: the normalised residual of one direction that has
not converged is only about ``1/√n``, which a ``tol`` near ``1/n`` would take for
the rounding floor. Its iterate is frozen, so it does
not degrade while the others go on. Eagerly the loop reads which matrices are still
active only every ``check_every`` steps, which bounds the host syncs; at those check
points the stack is compacted to the active matrices (the finished ones are set
aside), so the work shrinks as matrices converge and a step in which every matrix
stays active writes no per-matrix select at all. A step hands back its residual
and a deferred update: when a check finds every matrix done, the update (all of
a step's products but the one its residual shares) is never formed. Under ``jax.jit`` or
``torch.compile`` the shapes must stay fixed: the loop is
:func:`matroot._xp.bounded_loop` (a device-side ``lax.while_loop``, or all steps
unrolled) with per-matrix freezing and no host reads.
"""

from __future__ import annotations

from typing import NamedTuple
from collections.abc import Callable

import math

import numpy as np

from .. import _xp
from .._typing import Array


#: A step that fails to halve the residual counts as a stall only once the
#: spectral norm of the iteration's residual matrix is below this (bounded by its
#: Frobenius norm): every eigenvalue of the iterate is then within a quarter of its
#: limit, where convergence is quadratic and only rounding stops the progress.
STALL_SPECTRAL_CEILING = 0.25


class IterationOutcome(NamedTuple):
    """Final iterate and per-matrix diagnostics of :func:`iterate_frozen`.

    ``converged`` is the loop's stop verdict (the residual met ``tol`` or stalled at
    the rounding floor); whether a root is converged is decided once, from the
    check of the returned root, by :func:`matroot.accuracy.is_converged`."""

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
    """Run ``state = step(state, k)`` per matrix until its residual is at most ``tol``.

    Parameters
    ----------
    state : tuple of arrays, each with the batch on its first axis
        The coupled iterates (b, n, n), plus any per-matrix parameters the step
        reads (they are compacted with the iterates).
    step : callable
        ``step(state, k) -> (residual_of_state, advance)`` for step number ``k``
        (a Python int, or from ``k = 1`` on a traced scalar under ``jax.jit``);
        the residual belongs to the *incoming* state, so a product it shares with
        the update is formed once, and ``advance()`` returns the next state. The
        loop calls it only where some matrix goes on.
    residual_of : callable
        ``residual_of(state) -> residual``, used only when ``max_iter`` is hit.
    tol : float
        Per-matrix stop threshold; 0 runs exactly ``max_iter`` steps. A matrix
        counts as converged when it met ``tol`` or stalled at the rounding floor.
    max_iter : int
        Step cap.
    check_every : int
        Steps between host-side checks for an early exit and compaction.
    stall_level : float, optional
        Residual below which a step that does not halve it counts as a stall;
        default ``min(sqrt(tol), STALL_SPECTRAL_CEILING/√n)``, so that a stall is
        judged only when every direction has converged. A 16-bit phase whose
        rounding floor lies far above ``tol`` passes a multiple of its unit
        roundoff (its working-precision polish steps then use the default).
    """
    xp = _xp.array_namespace(state[0])
    traced = _xp.is_traced(state[0])
    if stall_level is None:
        n = state[0].shape[-1]
        stall_level = min(tol ** 0.5, STALL_SPECTRAL_CEILING / math.sqrt(max(n, 1)))
    if traced:
        state, residual, iterations, active, stalled = _iterate_traced(
            xp, state, step, tol=tol, max_iter=max_iter, check_every=check_every,
            stall_level=stall_level)
        residual = xp.where(active, residual_of(state), residual)
    else:
        state, residual, iterations, stalled = _iterate_compacting(
            xp, state, step, residual_of, tol=tol, max_iter=max_iter,
            check_every=check_every, stall_level=stall_level)
    finite = xp.isfinite(residual)
    converged = finite & ((residual <= tol) | stalled) if tol > 0 else xp.zeros_like(finite)
    return IterationOutcome(state, residual, iterations, converged)


def _judge(xp, res, residual, active, stalled, *, tol, stall_level):
    """One step's verdict: the new residual record, who stays active, who stalled."""
    previous = residual
    residual = xp.where(active, res, residual)
    still = active & xp.isfinite(res)
    if tol > 0:
        stalled = stalled | (still & (res <= stall_level) & (res > previous / 2))
        still = still & (res > tol) & ~stalled
    return residual, still, stalled


def _fresh_records(xp, b, dtype, dev):
    """Per-matrix records before the first step: residual (inf), iterations (0),
    active (all), stalled (none)."""
    return (xp.full((b,), float("inf"), dtype=dtype, device=dev),
            xp.zeros((b,), dtype=xp.int32, device=dev),
            xp.ones((b,), dtype=xp.bool, device=dev),
            xp.zeros((b,), dtype=xp.bool, device=dev))


def _iterate_traced(xp, state, step, *, tol, max_iter, check_every, stall_level):
    """Fixed shapes: frozen matrices pass through every step unchanged."""
    b, dev = state[0].shape[0], _xp.device_of(state[0])

    def advance(carry, k):
        state, residual, iterations, active, stalled = carry
        res, updated = step(state, k)
        residual, still, stalled = _judge(xp, res, residual, active, stalled, tol=tol,
                                          stall_level=stall_level)
        state = tuple(_xp.batched_where(still, n, o) for n, o in zip(updated(), state))
        return state, residual, iterations + xp.astype(still, xp.int32), still, stalled

    carry = (tuple(state), *_fresh_records(xp, b, state[0].dtype, dev))
    return _xp.bounded_loop(advance, carry, max_iter=max_iter, running=lambda c: xp.any(c[3]),
                            check_every=check_every, traced=True)


def _iterate_compacting(xp, state, step, residual_of, *, tol, max_iter, check_every,
                        stall_level):
    """Eager: at check points the finished matrices leave the stack (not on JAX)."""
    b, dev = state[0].shape[0], _xp.device_of(state[0])
    residual, iterations, active, stalled = _fresh_records(xp, b, state[0].dtype, dev)
    finished = _SetAside(xp, b, dev)
    # Eager JAX compiles each operation once per shape: a shrinking stack would
    # compile every step anew, so there the stack keeps its shape.
    compact = not _xp.is_jax_namespace(xp)
    for k in range(max_iter):
        res, advance = step(state, k)
        residual, still, stalled = _judge(xp, res, residual, active, stalled, tol=tol,
                                          stall_level=stall_level)
        iterations = iterations + xp.astype(still, xp.int32)
        if (k + 1) % check_every and k + 1 < max_iter:
            state = tuple(_xp.batched_where(still, n, o) for n, o in zip(advance(), state))
            active = still
            continue
        keep = _xp.to_numpy(still)
        if not keep.any():
            # Every matrix keeps its incoming state: the update is not formed.
            active = still
            break
        new_state = advance()
        if keep.all():
            state, active = new_state, still
            continue
        if not compact or k + 1 == max_iter:
            state = tuple(_xp.batched_where(still, n, o) for n, o in zip(new_state, state))
            active = still
            continue
        # The matrices that stopped now keep their incoming state; the others go on.
        finished.add(~keep, state, residual, iterations, stalled)
        state, residual, iterations, stalled = finished.select(
            keep, new_state, residual, iterations, stalled)
        active = xp.ones((int(keep.sum()),), dtype=xp.bool, device=dev)
    else:
        if bool(xp.any(active)):
            # Matrices still active hit max_iter: their residual is of the state
            # before the last step, so form the final state's.
            residual = xp.where(active, residual_of(state), residual)
    return finished.merge(state, residual, iterations, stalled)


class _SetAside:
    """Rows of the per-matrix arrays that left the loop, and where they belong."""

    def __init__(self, xp, b, device):
        self.xp = xp
        self.device = device
        self.positions = np.arange(b)  # original index of each row still iterating
        self.parts = []  # (original indices, arrays) of the rows set aside

    def _take(self, mask, arrays):
        rows = self.xp.asarray(mask.nonzero()[0], device=self.device)
        return tuple(self.xp.take(a, rows, axis=0) for a in arrays)

    def add(self, mask, state, *per_matrix):
        if mask.any():
            self.parts.append((self.positions[mask], self._take(mask, (*state, *per_matrix))))

    def select(self, keep, state, *per_matrix):
        """``state`` and the per-matrix arrays restricted to the ``keep`` rows."""
        self.positions = self.positions[keep]
        kept = self._take(keep, (*state, *per_matrix))
        return (kept[:len(state)], *kept[len(state):])

    def merge(self, state, *per_matrix):
        """The full arrays, rows back in their original order."""
        if not self.parts:
            return (state, *per_matrix)
        xp = self.xp
        order = np.concatenate([self.positions] + [pos for pos, _ in self.parts])
        pieces = [(*state, *per_matrix)] + [arrays for _, arrays in self.parts]
        inverse = xp.asarray(np.argsort(order), device=self.device)
        merged = tuple(xp.take(xp.concat([p[i] for p in pieces], axis=0), inverse, axis=0)
                       for i in range(len(pieces[0])))
        return (merged[:len(state)], *merged[len(state):])
