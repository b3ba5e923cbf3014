"""The shared loop of the iterative solvers: per-matrix freezing, batched stop checks.

Every matrix takes the first step (the start's residual decides nothing but
finiteness). Each matrix of a stack then stops on its own once its residual is at most ``tol``, once
the residual stalls at the rounding floor (it fell below ``sqrt(tol)``, every
direction has converged, and then it did not halve in a step: quadratic
convergence has ended, and more steps only add rounding error), or once it turns
non-finite. "Every direction" is read from the residual's unnormalised Frobenius
norm ``√n·residual ≥ ‖I − M‖₂``: the normalised residual of one direction that has
not converged is only about ``1/√n``, which a ``tol`` near ``1/n`` would take for
the rounding floor. Its iterate is frozen, so it does
not degrade while the others go on. Eagerly the loop reads which matrices are still
active only every ``check_every`` steps, which bounds the host syncs (the iteration
counts are kept on the host from those reads); at those check points the stack is
compacted to the active matrices (the finished ones are set aside), so the work
shrinks as matrices converge and a step in which every matrix stays active writes
no per-matrix select at all. On a GPU a step's time is about the number of
operations it dispatches, so the per-step verdict is a handful of elementwise
operations (:class:`_Judge`). A step hands back its residual
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
    check of the returned root, by :func:`matroot.certify.accuracy.is_converged`."""

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
    residual_scale: float = 1.0,
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
        Like ``step``'s, its residual is in units of ``1/residual_scale``.
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
    residual_scale : float, optional
        The factor from the residuals ``step`` returns (e.g. an unnormalised
        Frobenius norm) to the reported residual that ``tol`` and ``stall_level``
        refer to: the loop compares against thresholds divided by it and scales
        the residual once at the end instead of every step.
    """
    xp = _xp.array_namespace(state[0])
    if stall_level is None:
        n = state[0].shape[-1]
        stall_level = min(tol ** 0.5, STALL_SPECTRAL_CEILING / math.sqrt(max(n, 1)))
    judge = _Judge(xp, state[0], tol=tol / residual_scale,
                   stall_level=stall_level / residual_scale)
    # Any leaf: under jax.vmap a leaf built from constants (an identity start) is concrete.
    if any(_xp.is_traced(leaf) for leaf in state):
        state, residual, iterations, limited = _iterate_traced(
            xp, state, step, judge, max_iter=max_iter, check_every=check_every)
        residual = xp.where(limited, residual_of(state), residual)
    else:
        state, residual, iterations, limited = _iterate_eager(
            xp, state, step, residual_of, judge, max_iter=max_iter, check_every=check_every)
    if residual_scale != 1.0:
        residual = residual * residual_scale
    finite = xp.isfinite(residual)
    # A matrix that stopped before max_iter with a finite residual above tol stalled.
    converged = finite & ((residual <= tol) | ~limited) if tol > 0 else xp.zeros_like(finite)
    return IterationOutcome(state, residual, iterations, converged)


class _Judge:
    """One step's verdict per matrix, in a handful of elementwise operations.

    A matrix goes on while its residual is finite and above a threshold: ``tol``
    after a step that at least halved the residual, ``max(tol, stall_level)`` after
    one that did not (below ``stall_level`` that is a stall: the matrix stops, and
    counts as converged). The residual is a norm, so ``res < inf`` is its finiteness
    test (NaN fails every comparison). With ``tol = 0`` only non-finite residuals stop.
    """

    def __init__(self, xp, like, *, tol: float, stall_level: float):
        self.xp = xp
        self.stops = tol > 0
        if self.stops:
            dtype, device = like.dtype, _xp.device_of(like)
            self.halved = xp.asarray(tol, dtype=dtype, device=device)
            self.not_halved = xp.asarray(max(tol, stall_level), dtype=dtype, device=device)

    def __call__(self, res, previous, active, first=False):
        """``(record, still)`` for residuals ``res`` of a step, ``previous`` the record
        (the last residual of each matrix while it iterated; inf before the first step)
        and ``active`` the matrices that took the step (None: all of them). ``first``:
        the residual of the start, before any step: only a non-finite one stops there
        (a start already within ``tol`` in norm, e.g. the first minimax iterate I/s at
        p = 1 and a loose tol, can be far off in one direction)."""
        xp = self.xp
        still = res < math.inf
        if self.stops and not first:
            threshold = xp.where(res * 2 > previous, self.not_halved, self.halved)
            still = still & (res > threshold)
        if active is None:
            return res, still
        return xp.where(active, res, previous), still & active


def _select(xp, mask, new, old):
    """Per matrix, the arrays of ``new`` where ``mask`` holds, else those of ``old``
    (an array the step left as it was is not selected)."""
    widened = {}

    def pick(n, o):
        if n is o:
            return o
        if n.ndim not in widened:
            widened[n.ndim] = xp.reshape(mask, (-1,) + (1,) * (n.ndim - 1))
        return xp.where(widened[n.ndim], n, o)

    return tuple(pick(n, o) for n, o in zip(new, old))


def _iterate_traced(xp, state, step, judge, *, max_iter, check_every):
    """Fixed shapes: frozen matrices pass through every step unchanged. Returns the
    state, residual record, iterations and which matrices were still iterating."""
    b, dev = state[0].shape[0], _xp.device_of(state[0])

    def advance(carry, k):
        state, residual, iterations, active = carry
        res, updated = step(state, k)
        residual, still = judge(res, residual, active, first=isinstance(k, int) and k == 0)
        state = _select(xp, still, updated(), state)
        return state, residual, iterations + xp.astype(still, xp.int32), still

    carry = (tuple(state), xp.full((b,), math.inf, dtype=state[0].dtype, device=dev),
             xp.zeros((b,), dtype=xp.int32, device=dev), xp.ones((b,), dtype=xp.bool, device=dev))
    return _xp.bounded_loop(advance, carry, max_iter=max_iter, running=lambda c: xp.any(c[3]),
                            check_every=check_every, traced=True)


def _iterate_eager(xp, state, step, residual_of, judge, *, max_iter, check_every):
    """Eager: the step masks of each check interval are read on the host at its
    check point, which also counts the iterations there; then the finished
    matrices leave the stack (not on JAX). Between check points a matrix that
    stopped keeps its state by a per-matrix select."""
    b, dev = state[0].shape[0], _xp.device_of(state[0])
    residual = xp.full((b,), math.inf, dtype=state[0].dtype, device=dev)
    active = None  # which matrices of the stack iterate; None: all of them
    iterations = np.zeros(b, dtype=np.int32)  # host, by original position
    keep = np.ones(b, dtype=bool)  # host: who went on at the last check point
    finished = _SetAside(xp, b, dev)
    # Eager JAX compiles each operation once per shape: a shrinking stack would
    # compile every step anew, so there the stack keeps its shape.
    compact = not _xp.is_jax_namespace(xp)
    masks = []  # this check interval's per-step `still`
    for k in range(max_iter):
        res, advance = step(state, k)
        residual, still = judge(res, residual, active, first=k == 0)
        masks.append(still)
        if (k + 1) % check_every and k + 1 < max_iter:
            state, active = _select(xp, still, advance(), state), still
            continue
        host = _xp.to_numpy(masks[0] if len(masks) == 1 else xp.stack(masks))
        host = host.reshape(len(masks), -1)
        masks = []
        keep = host[-1]
        iterations[finished.positions] += host.sum(axis=0, dtype=np.int32)
        if not keep.any():
            # Every matrix keeps its incoming state: the update is not formed.
            break
        new_state = advance()
        if keep.all():
            state, active = new_state, None
        elif not compact or k + 1 == max_iter:
            state, active = _select(xp, still, new_state, state), still
        else:
            # The matrices that stopped now keep their incoming state; the others go on.
            finished.add(~keep, state, residual)
            state, residual = finished.select(keep, new_state, residual)
            active = None
    else:
        if keep.any():
            # Matrices still active hit max_iter: their residual is of the state
            # before the last step, so form the final state's.
            final = residual_of(state)
            residual = final if active is None else xp.where(active, final, residual)
    limited = np.zeros(b, dtype=bool)
    limited[finished.positions] = keep
    state, residual = finished.merge(state, residual)
    return (state, residual, _xp.from_numpy(xp, iterations, device=dev),
            _xp.from_numpy(xp, limited, device=dev))


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

    def add(self, mask, state, residual):
        if mask.any():
            self.parts.append((self.positions[mask], self._take(mask, (*state, residual))))

    def select(self, keep, state, residual):
        """``state`` and ``residual`` restricted to the ``keep`` rows."""
        self.positions = self.positions[keep]
        kept = self._take(keep, (*state, residual))
        return kept[:-1], kept[-1]

    def merge(self, state, residual):
        """The full arrays, rows back in their original order."""
        if not self.parts:
            return state, residual
        xp = self.xp
        order = np.concatenate([self.positions] + [pos for pos, _ in self.parts])
        pieces = [(*state, residual)] + [arrays for _, arrays in self.parts]
        inverse = xp.asarray(np.argsort(order), device=self.device)
        merged = tuple(xp.take(xp.concat([p[i] for p in pieces], axis=0), inverse, axis=0)
                       for i in range(len(pieces[0])))
        return merged[:-1], merged[-1]
