"""Per-step coefficients of the minimax iteration, computed once in float64 and cached.

The coupled iteration of :mod:`matroot.solvers.minimax` applies, at step k, an odd
quintic ``f_k(s) = s·q_k(s²)`` to every "singular value" ``s`` of the block matrix
``[[0, Y], [Z, 0]]`` (``s = √(eigenvalue of ZY)``, starting at ``s = √λ`` for
``Y₀ = A``, ``Z₀ = I``); ``s → 1`` means ``Y → A^(1/2)`` and ``Z → A^(-1/2)``.
Given an interval ``[lo, hi]`` that holds every ``s``, the best quintic is the
minimax approximation of 1 on that interval (Polar Express, arXiv 2505.16932: the
greedy per-step minimax choice is also optimal for the composition). Its error
``E`` gives the next interval ``[1 − E, 1 + E]``.

Rounding and a too-small λmax estimate can put some ``s`` slightly above ``hi``,
where the early (steep) polynomials grow fast: a value 1% too large at the top is
enough to diverge. Each step is therefore designed on ``[lo, hi·(1 + margin)]``:
the first with ``FIRST_MARGIN`` (λ up to ``1.21×`` the scale survives), the later
ones with a margin of ``√u`` for the unit roundoff ``u``. Once the error is below
``TAIL_SWITCH`` the schedule hands over to the fixed quintic ``TAIL`` (the
Newton–Schulz-type map with ``f(1) = 1``, ``f'(1) = f''(1) = 0``: cubic
convergence and a basin up to ``s ≈ 1.6``), which also serves any extra steps.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from .. import _xp
from ._lower_grid import device_grid_index, lower_grid

__all__ = [
    "FIRST_MARGIN",
    "TAIL",
    "TAIL_SWITCH",
    "quintic_sign_minimax",
    "rounding_margin",
    "Schedule",
    "schedule",
    "schedule_grid",
    "about_identity",
    "TAIL_ABOUT_IDENTITY",
    "host_coefficient_table",
    "device_coefficient_table",
    "z_norm_bounds",
]

#: Relative headroom above the top of the first interval (in s, so λ may exceed
#: the scale by up to ``(1 + FIRST_MARGIN)² = 1.21``: power-iteration shortfall).
FIRST_MARGIN = 0.1
#: The schedule switches to :data:`TAIL` once the interval error is this small.
TAIL_SWITCH = 1e-3
#: ``q(x) = 15/8 − (5/4)·x + (3/8)·x²``: the fixed-point quintic for s near 1.
TAIL = (15.0 / 8.0, -10.0 / 8.0, 3.0 / 8.0)
#: Intervals with ``lo/hi`` above this are already converged to float64 level.
_NARROWEST = 1.0 - 1e-5
#: Smallest lower bound on the scaled spectrum (λ/scale) a schedule is built for.
SMALLEST_LOWER = 1e-14


def quintic_sign_minimax(ratio: float):
    """Minimax odd quintic approximation of 1 on ``[ratio, 1]``.

    Remez exchange in float64 on the basis ``s, s·w, s·w²`` with
    ``w = (s² − m)/h`` mapping ``[ratio², 1]`` onto ``[−1, 1]`` (the monomial basis
    is singular for narrow intervals). The interior extrema are the roots of a
    quadratic in ``w``, so each exchange is exact.

    Parameters
    ----------
    ratio : float
        ``lo / hi`` of the interval, ``0 < ratio < 1``.

    Returns
    -------
    coefficients : ndarray, shape (3,)
        ``(c1, c3, c5)`` of ``f(s) = c1·s + c3·s³ + c5·s⁵``.
    error : float
        ``max |1 − f(s)|`` on ``[ratio, 1]``, attained with alternating sign at
        ``ratio``, two interior points and 1.

    Examples
    --------
    >>> from matroot.solvers.minimax_coefficients import quintic_sign_minimax
    >>> c, e = quintic_sign_minimax(0.5)
    >>> round(e, 6)
    0.024047
    """
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"ratio must lie in (0, 1), got {ratio}")
    m, h = (1.0 + ratio * ratio) / 2.0, (1.0 - ratio * ratio) / 2.0
    signs = np.array([1.0, -1.0, 1.0, -1.0])
    w = np.array([-1.0, -0.5, 0.6, 1.0])
    for _ in range(100):
        # The ends exactly: sqrt(m − h) cancels catastrophically for tiny ratios.
        s = np.concatenate([[ratio], np.sqrt(m + h * w[1:3]), [1.0]])
        system = np.stack([s, s * w, s * w * w, signs], axis=1)
        alpha, beta, gamma, error = np.linalg.solve(system, np.ones(4))
        # d/ds [s·(α + βw + γw²)] = 0, written in w.
        mh = m / h
        roots = np.roots([5.0 * gamma, 3.0 * beta + 4.0 * gamma * mh, alpha + 2.0 * beta * mh])
        roots = np.sort(roots.real[(np.abs(roots.imag) == 0) & (np.abs(roots.real) < 1)])
        if roots.size != 2:
            raise RuntimeError(f"Remez exchange lost the alternation at ratio={ratio}")
        new_w = np.array([-1.0, roots[0], roots[1], 1.0])
        done = np.max(np.abs(new_w - w)) <= 1e-13
        w = new_w
        if done:
            break
    c1 = alpha - beta * mh + gamma * mh * mh
    c3 = beta / h - 2.0 * gamma * m / (h * h)
    c5 = gamma / (h * h)
    return np.array([c1, c3, c5]), float(abs(error))


def rounding_margin(unit_roundoff: float) -> float:
    """Headroom kept above each later interval for rounding: ``√u``.

    The schedule's own error floor (about ``0.08·margin³``) then stays below the
    unit roundoff ``u``, while an ``s`` pushed up by rounding stays inside the
    design interval (overshoots of a few ``u`` are typical; with 16-bit operands
    even a margin of 1e-3 was measured not to diverge, so ``√u`` is generous).
    """
    return math.sqrt(unit_roundoff)


class Schedule(NamedTuple):
    """Step k's ``q(x) = a + b·x + c·x²`` is ``coefficients[k] = (a, b, c)``;
    ``errors[k]`` is the predicted ``max |1 − s|`` after it. Later steps use
    :data:`TAIL`."""

    coefficients: np.ndarray
    errors: np.ndarray


@functools.lru_cache(maxsize=1024)
def schedule(lower: float, margin: float, first_margin: float = FIRST_MARGIN) -> Schedule:
    """The step coefficients for a stage whose spectrum lies in ``[lower, 1]``.

    Parameters
    ----------
    lower : float
        Lower bound on the scaled eigenvalues λ (so ``s₀ ≥ √lower``).
    margin : float
        Relative headroom kept above the top of every interval after the first
        (see :func:`rounding_margin`).
    first_margin : float
        Headroom above 1 for the first step (covers a λmax underestimate).

    Returns
    -------
    Schedule
        Read-only arrays of shape (K, 3) and (K,); K is the number of minimax
        steps before the error falls below :data:`TAIL_SWITCH`.

    Examples
    --------
    >>> from matroot.solvers.minimax_coefficients import schedule
    >>> sch = schedule(1e-4, 1e-3)
    >>> len(sch.coefficients), bool(sch.errors[-1] < 1e-3)
    (5, True)
    """
    lo, hi = math.sqrt(lower), 1.0
    top = hi * (1.0 + first_margin)
    rows, step_errors = [], []
    while lo / top < _NARROWEST:
        (c1, c3, c5), error = quintic_sign_minimax(lo / top)
        rows.append((c1 / top, c3 / top ** 3, c5 / top ** 5))
        step_errors.append(error)
        if error <= TAIL_SWITCH:
            break
        lo, hi = 1.0 - error, 1.0 + error
        top = hi * (1.0 + margin)
    coefficients = np.array(rows, dtype=np.float64).reshape(-1, 3)
    errors = np.array(step_errors, dtype=np.float64)
    coefficients.flags.writeable = False
    errors.flags.writeable = False
    return Schedule(coefficients, errors)


@functools.lru_cache(maxsize=16)
def schedule_grid(margin: float):
    """The schedules of every grid lower bound, for indexing on the device.

    Returns
    -------
    grid : ndarray, shape (G,)
        The lower bounds :func:`quantize_lower` can return, ascending.
    coefficients : ndarray, shape (G, K, 3)
        Row g is ``schedule(grid[g], margin).coefficients`` padded with
        :data:`TAIL` to the longest schedule's K steps.
    """
    grid = lower_grid(SMALLEST_LOWER)
    rows = [schedule(float(v), margin).coefficients for v in grid]
    table = np.empty((len(grid), max(len(r) for r in rows), 3))
    table[:] = TAIL
    for g, r in enumerate(rows):
        table[g, : len(r)] = r
    table.flags.writeable = False
    return grid, table


# The tables the iteration reads: each step's polynomial about the identity, per matrix,
# cut or padded to the steps run, on the host or indexed on the device.


def about_identity(rows):
    """Coefficients ``(a, b, c)`` of ``q(X) = a + bX + cX²`` (host, (..., 3)) as those
    of the same polynomial in ``D = X − I``: ``q = (a + b + c) + (b + 2c)·D + c·D²``.

    The loop forms ``D`` for its residual anyway, and near convergence ``q ≈ I + βD``
    suffers no cancellation between large terms.

    Examples
    --------
    >>> about_identity(np.array([15 / 8, -10 / 8, 3 / 8])).tolist()
    [1.0, -0.5, 0.375]
    """
    rows = np.asarray(rows, dtype=np.float64)
    a, b, c = rows[..., 0], rows[..., 1], rows[..., 2]
    return np.stack([a + b + c, b + 2 * c, c], axis=-1)


#: :data:`TAIL` about the identity (see :func:`about_identity`).
TAIL_ABOUT_IDENTITY = tuple(float(v) for v in about_identity(TAIL))


def _padded(rows, steps):
    """Schedule rows (..., K, 3) cut or padded with :data:`TAIL` to ``max(steps, 1)``,
    about the identity (:func:`about_identity`)."""
    out = np.empty((*rows.shape[:-2], max(steps, 1), 3))
    out[:] = TAIL
    kept = min(rows.shape[-2], out.shape[-2])
    out[..., :kept, :] = rows[..., :kept, :]
    return about_identity(out)


def host_coefficient_table(lowers, margin, steps):
    """Host (steps, b, 3) per-step, per-matrix coefficients about the identity; past
    a schedule's end :data:`TAIL`'s."""
    return np.stack([_padded(schedule(v, margin).coefficients, steps) for v in lowers], axis=1)


def device_coefficient_table(xp, lowers, margin, steps, dtype, device):
    """Under tracing: (b, steps, 3), every grid bound's schedule indexed on the device
    by the bounds ``lowers`` (a device array)."""
    grid, rows = _grid_rows(margin, steps)
    rows = _xp.from_numpy(xp, rows, dtype=dtype, device=device)
    return xp.take(rows, device_grid_index(lowers, grid), axis=0)


@_xp.host_constant
def _grid_rows(margin, steps):
    """The grid and its schedules cut or padded to ``steps`` rows: (G,), (G, steps, 3)."""
    grid, table = schedule_grid(margin)
    return grid, _padded(table, steps)


def z_norm_bounds(lowers, margin, steps):
    """Host upper bounds on ``‖Z_k‖`` before each step ``k < steps``, for a stack.

    ``Z_k`` acts on eigenvalue λ as ``s_k/√λ``: a small λ is multiplied by at
    most ``q_j(0) = a_j`` per step, and ``s_k ≤ 1 + FIRST_MARGIN`` caps the
    product at ``1.1/√λmin``.
    """
    bounds = np.ones(steps)
    for lower in lowers:
        growth = np.full(steps, TAIL[0])
        head = schedule(lower, margin).coefficients[:steps, 0]
        growth[: len(head)] = head
        # A long run's product overflows to inf, which the cap below replaces.
        with np.errstate(over="ignore"):
            z = np.concatenate([[1.0], np.cumprod(growth[:-1])])
        bounds = np.maximum(bounds, np.minimum(z, (1 + FIRST_MARGIN) / math.sqrt(lower)))
    return bounds
