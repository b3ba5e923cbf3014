"""Certified λmax bounds of the Shampoo factors, carried from step to step.

A root solve needs an upper bound on λmax of its matrix; finding one afresh costs
a Cholesky test per factor (:func:`matroot.spectrum.scaling.certified_lambda_max`). The
factors move by known amounts, so a bound can be carried instead, for O(n) per
block and step:

    λmax(β·L + (1−β)·GGᵀ) ≤ β·λmax(L) + (1−β)·‖G‖²_F

(the same for R with GᵀG; ‖G‖²_F is the trace of the statistic GGᵀ). Each factor
has two numbers, one ``(count, 2)`` array per stack:

- ``[:, UPPER]``: a certified upper bound on λmax of the stored factor (without
  the ridge), widened by :func:`rounding_margin` times the factor's trace at each
  step, which covers the rounding of the products and of the accumulation
  (``‖|L|‖₂ ≤ trace(L)`` for a positive semidefinite L);
- ``[:, FLOOR]``: ``βᵏ`` times the bound of the last fresh solve, k steps ago, a
  lower estimate of λmax (``λmax(β·L + S) ≥ β·λmax(L)`` for S ⪰ 0).

The bound only grows looser (a gradient's Frobenius norm overstates its spectral
norm by up to its rank). A loose bound scales the spectrum below the solver's
sweet spot and costs iterations, more than the Cholesky test saves; so a stack's
carried bounds are used only while every factor's bound is within
:data:`CARRY_SLACK` of its floor, and a stack whose bound has drifted further is
solved with a fresh bound that restarts both numbers. A matrix whose root fails
with a carried bound gets an unknown bound (+inf), so a bound that was wrong
(which the solver's check of the root catches) is never used twice.
"""

from __future__ import annotations

from ... import _xp
from ...certify.accuracy import unit_roundoff

__all__ = [
    "UPPER",
    "FLOOR",
    "CARRY_SLACK",
    "zero_bounds",
    "unknown_bounds",
    "rounding_margin",
    "advanced_bounds",
    "advance_bounds_in_place",
    "carried_lambda_max",
    "bounds_after_refresh",
]

#: Columns of a bound stack.
UPPER, FLOOR = 0, 1
#: A stack's carried bounds are used while each is at most this multiple of its floor;
#: 10 % looser scaling costs Newton-type solvers about a tenth of an iteration, less
#: than the Cholesky test a fresh bound costs.
CARRY_SLACK = 1.1


def zero_bounds(count: int, xp, dtype, device):
    """The bounds of all-zero factors (a new stack): λmax = 0, exactly known."""
    return xp.zeros((count, 2), dtype=dtype, device=device)


def unknown_bounds(count: int, xp, dtype, device):
    """Bounds that force a fresh solve (a state saved before bounds were carried)."""
    upper = xp.full((count, 1), float("inf"), dtype=dtype, device=device)
    return xp.concat([upper, xp.zeros_like(upper)], axis=1)


def rounding_margin(xp, dtype, inner: int, n: int) -> float:
    """Multiple of a factor's trace that covers the rounding of one factor update.

    ``fl(GGᵀ)`` is off by at most ``γ_inner·|G||G|ᵀ`` entrywise, the accumulation
    ``β·L + (1−β)·S`` by ``γ₂`` of its terms' magnitudes, and summing the statistic's
    diagonal by ``γ_n``; every such term's 2-norm is at most ``γ`` times a trace.
    Twice the first-order sum, for the terms of second order.

    Examples
    --------
    >>> import numpy as np
    >>> rounding_margin(np, np.float32, 256, 256) < 1e-4
    True
    """
    return 2.0 * (2 * inner + n + 8) * unit_roundoff(xp, dtype)


def _traces(matrices):
    xp = _xp.array_namespace(matrices)
    return xp.sum(xp.linalg.diagonal(matrices), axis=-1)


def advanced_bounds(old, statistic, factor_diagonals, beta2: float, margin: float):
    """The bounds of ``k`` factors after one update, from their bounds before it.

    Parameters
    ----------
    old : array, shape (k, 2)
    statistic : array, shape (k, n, n)
        This step's ``GGᵀ`` (or ``GᵀG``, ``ggᵀ``) of each block, as computed.
    factor_diagonals : array, shape (k, n)
        The diagonals of the updated factors.
    beta2 : float
    margin : float
        From :func:`rounding_margin`.

    Returns
    -------
    array, shape (k, 2)
    """
    xp = _xp.array_namespace(old)
    rounding = margin * xp.sum(factor_diagonals, axis=-1)
    if beta2 == 1.0:
        upper, floor = old[:, UPPER] + _traces(statistic) + rounding, old[:, FLOOR]
    else:
        upper = beta2 * old[:, UPPER] + (1.0 - beta2) * _traces(statistic) + rounding
        floor = beta2 * old[:, FLOOR]
    # The sum above rounds too: a few units of its own, upwards.
    upper = upper * (1.0 + 4 * unit_roundoff(xp, old.dtype))
    return xp.stack([upper, floor], axis=-1)


def advance_bounds_in_place(bounds, statistic, factor_diagonals, beta2: float,
                            margin: float, *, skip=None) -> None:
    """:func:`advanced_bounds` written into ``bounds`` (a ``(k, 2)`` view into a bound
    stack) in a few operations on the bounds: the same bound, its three terms summed
    in another order (within the final widening's slack). ``skip``, the bounds' dtype's
    :class:`~matroot.optim.shampoo_core.skipping.Coefficients`, keeps the bounds of a
    step skipped on the device (decay and widening 1, the increment times 0)."""
    xp = _xp.array_namespace(bounds)
    rounding = margin * xp.sum(factor_diagonals, axis=-1)
    widen = 1.0 + 4 * unit_roundoff(xp, bounds.dtype)
    decay = beta2
    if skip is not None:
        decay, widen = skip.factor_decay, skip.widen
    if beta2 != 1.0:
        bounds *= decay
        rounding += (1.0 - beta2) * _traces(statistic)
    else:
        rounding += _traces(statistic)
    upper = bounds[:, UPPER]
    if skip is None:
        upper += rounding
    else:
        _add_product_(xp, upper, rounding, skip.taken)
    upper *= widen


def _add_product_(xp, target, a, b) -> None:
    """``target += a·b`` in place: one fused operation on torch."""
    if _xp.is_torch_namespace(xp):
        target.addcmul_(a, b)
    else:
        target += a * b


def carried_lambda_max(bounds, eps: float):
    """Which carried bounds are tight enough to use, and the bounds on
    ``λmax(factor + eps·I)`` to pass as ``lambda_max_upper``.

    Returns
    -------
    tight : boolean array, shape (count,)
        Per factor: its bound is finite and within :data:`CARRY_SLACK` of its floor.
    upper : array, shape (count,)
    """
    xp = _xp.array_namespace(bounds)
    upper, floor = bounds[:, UPPER], bounds[:, FLOOR]
    # ``upper < inf`` is isfinite for a non-negative bound (NaN compares False).
    tight = (upper < float("inf")) & (upper <= CARRY_SLACK * floor)
    return tight, (upper + eps) * (1.0 + 2 * unit_roundoff(xp, bounds.dtype))


def bounds_after_refresh(bounds, result, ok, *, eps: float, margin_traces, carried: bool):
    """A stack's bounds after its roots were solved.

    Parameters
    ----------
    bounds : array, shape (count, 2)
    result : InvRootResult
        The solve; ``result.lambda_max`` bounds ``λmax(factor + eps·I)``.
    ok : boolean array, shape (count,)
        Which roots were kept.
    eps : float
        The ridge.
    margin_traces : array, shape (count,)
        The factors' traces times the rounding margin of the solver's bound.
    carried : bool or 0-d boolean array
        The solve used the carried bounds (they stay, +inf where the root failed),
        or found its own (they replace bound and floor).

    Returns
    -------
    array, shape (count, 2)
    """
    xp = _xp.array_namespace(bounds)
    found = result.lambda_max
    inf = xp.full_like(found, float("inf"))
    if isinstance(carried, bool) and carried:
        return xp.stack([xp.where(ok, bounds[:, UPPER], inf), bounds[:, FLOOR]], axis=-1)
    # λmax is non-negative: below +inf is finite (NaN compares False).
    usable = found < inf
    above_ridge = xp.maximum(found - eps, xp.zeros_like(found))
    fresh = xp.stack([xp.where(usable, above_ridge + margin_traces, inf),
                      xp.where(usable, above_ridge, xp.zeros_like(found))], axis=-1)
    if isinstance(carried, bool):
        return fresh
    kept = xp.stack([xp.where(ok, bounds[:, UPPER], inf), bounds[:, FLOOR]], axis=-1)
    return xp.where(carried, kept, fresh)
