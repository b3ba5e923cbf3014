"""Minimax polynomial iteration for A^(±1/2), and A^(-1/p) for p a power of two.

``sign([[0, A], [I, 0]]) = [[0, A^(1/2)], [A^(-1/2), 0]]``, and an odd polynomial
``f(s) = s·q(s²)`` applied to ``W = [[0, Y], [Z, 0]]`` is
``[[0, Y·q(ZY)], [q(ZY)·Z, 0]]``. So the coupled step ``X = ZY``,
``Y ← Y·q(X)``, ``Z ← q(X)·Z`` acts on every ``s = √(eigenvalue of X)`` as ``f``,
starting from ``s = √λ`` (``Y₀ = A``, ``Z₀ = I``); ``s → 1`` gives ``Y → A^(1/2)``,
``Z → A^(-1/2)``. Newton–Schulz is the fixed choice ``q(x) = (3 − x)/2``; here
each step's quintic is the minimax approximation of 1 on the current interval of
``s`` (:mod:`matroot.solvers.minimax_coefficients`), which multiplies the smallest
``s`` by about 4.3 per step instead of 1.5 and ends with cubic convergence.

Cost per step: ``X = ZY``, ``X²``, ``Y·q``, ``q·Z``: 4 matmuls, 2 in the first
step (``X₀ = A``, ``q·Z₀ = q``). Steps to ``max |1 − s| ≤ 1e-3`` in exact
arithmetic, with the margins used here: κ = 1e2: 3, 1e4: 5, 1e6: 7 (Newton–Schulz:
9, 14, 20 at 3 matmuls each).

p = 2^k runs k stages: stages 1..k−1 take square roots (their ``Y``), the last an
inverse square root (its ``Z``); each stage's lower bound is the square root of
the previous one's, so the later stages are far better conditioned and cheap.
p = 1 squares ``A^(-1/2)``.

Low precision (``matmul_dtype``): the products with a bounded operand (``X²``,
``Y·q``; ``‖Y‖ ≲ 1``, ``‖q‖ ≲ 8.5``) round their operands to 16 bits, the ones
with the large-norm ``Z`` (``‖Z‖`` grows to ``√κ``) stay in the working dtype,
and once the 16-bit phase has converged to its own floor the iteration finishes
with working-precision :data:`TAIL` steps. Rounding errors of the 16-bit phase
that break ``Y = A·Z`` are not undone by the polish; see
``docs``/the module tests for the accuracy per κ: float16 is safe for κ ≲ 1e4,
bfloat16 for κ ≲ 1e3 (eps ≳ 1e-3·λmax).
"""

from __future__ import annotations

import math

import numpy as np

from .. import _xp
from ._iteration import IterationOutcome, iterate_frozen
from ._result import SolverOutput
from .minimax_coefficients import TAIL, quantize_lower, rounding_margin, schedule

#: Matmuls of the first step (``X₀ = A``, ``Z₀ = I``) and of every later one.
FIRST_STEP_MATMULS = 2
STEP_MATMULS = 4
#: With 16-bit operands the residual, formed from a 16-bit ``ZY``, bottoms out
#: near ``8u`` (measured, float16 and bfloat16): the 16-bit phase stops at
#: ``LOW_PRECISION_FLOOR·u`` or when it stalls below twice that.
LOW_PRECISION_FLOOR = 16.0
#: The 16-bit phase runs at most the longest schedule of the stack plus this
#: many :data:`TAIL` steps; working-precision TAIL steps finish (at least one).
LOW_PRECISION_EXTRA_STEPS = 2
#: Slack on the next stage's lower bound for the previous stage's residual error.
STAGE_SLACK = 0.9


def unit_roundoff(xp, dtype) -> float:
    """``u = eps/2`` of a floating dtype of namespace ``xp``."""
    return float(xp.finfo(dtype).eps) / 2


def _coefficient_table(xp, lowers, margin, steps, dtype, device):
    """(steps, b, 3) per-step, per-matrix ``(a, b, c)``; past a schedule's end :data:`TAIL`."""
    table = np.empty((max(steps, 1), len(lowers), 3))
    table[:] = TAIL
    for i, lower in enumerate(lowers):
        rows = schedule(lower, margin).coefficients[:steps]
        table[: len(rows), i] = rows
    return _xp.from_numpy(xp, table, dtype=dtype, device=device)


def minimax_step(y, z, coeff, *, first, rounded, full, eye):
    """One coupled step ``X = ZY``, ``q = a + bX + cX²``, ``Y ← Y·q``, ``Z ← q·Z``.

    ``coeff`` holds per-matrix rows ``(a, b, c)``, shape (b, 3). ``first`` marks
    the step from ``Z = I`` (``X = Y``, ``q·Z = q``: 2 matmuls instead of 4).
    ``rounded`` forms ``ZY``, ``X²`` and ``q·Z`` (16-bit operands where asked);
    ``full`` forms ``Y·q`` in the working dtype: rounding ``Y`` (``Y₀ = A``) to
    16 bits moves its small eigenvalues by ``u·λmax``, which no later step undoes,
    while the other three products were measured to cost little accuracy.

    Returns
    -------
    (X, (Y, Z))
        The incoming ``X`` (for the residual) and the next iterates.
    """
    x = y if first else rounded(z, y)
    c0, c1, c2 = (coeff[:, j][:, None, None] for j in range(3))
    q = c0 * eye + c1 * x + c2 * rounded(x, x)
    return x, (full(y, q), q if first else rounded(q, z))


def minimax_sqrt(a, lower, *, tol, max_iter, check_every, matmul, margin=None):
    """Coupled minimax iteration: ``Y → a^(1/2)``, ``Z → a^(-1/2)``.

    Parameters
    ----------
    a : array, shape (b, n, n)
        Symmetric stack with spectrum in ``[lower, 1]`` (the first step has
        headroom up to ``λ = 1.21``).
    lower : sequence of float, length b
        Host-side lower bounds on each matrix's spectrum.
    tol, max_iter, check_every
        As in :func:`matroot.solvers._iteration.iterate_frozen`; the residual is
        ``‖I − ZY‖_F/√n``. ``tol = 0`` runs exactly ``max_iter`` steps.
    matmul : matroot._xp.Matmul
        Products. With a 16-bit operand dtype the schedule runs as
        :func:`minimax_step` describes (until the residual reaches
        ``LOW_PRECISION_FLOOR·u16`` or stalls, for at most the schedule's length
        plus ``LOW_PRECISION_EXTRA_STEPS``), then :data:`TAIL` steps in the
        working dtype finish (at least one; ``max_iter`` caps the total).
    margin : float, optional
        Rounding headroom of the schedule; default ``√u`` of the operand dtype.

    Returns
    -------
    (IterationOutcome, matmuls)
        ``state == (Y, Z)``; ``matmuls`` is the per-matrix count, shape (b,).
    """
    xp = _xp.array_namespace(a)
    dev = _xp.device_of(a)
    b, n = a.shape[0], a.shape[-1]
    eye = _xp.identity_stack(xp, n, a.dtype, dev)
    root_n = math.sqrt(n)
    low = matmul.operand_dtype is not None
    u = unit_roundoff(xp, matmul.operand_dtype if low else a.dtype)
    if margin is None:
        margin = rounding_margin(u)
    lowers = [quantize_lower(v) for v in lower]
    steps = max_iter
    if low and tol == 0:
        steps = max_iter - 1
    elif low:
        # More 16-bit steps than the schedule plus two TAIL steps cannot help,
        # and at κ ≳ 1e6 dozens of them drift (bfloat16 diverged).
        longest = max(len(schedule(v, margin).errors) for v in lowers)
        steps = min(max_iter - 1, longest + LOW_PRECISION_EXTRA_STEPS)
    table = _coefficient_table(xp, lowers, margin, steps, a.dtype, dev)
    tail = _xp.from_numpy(xp, np.broadcast_to(np.array(TAIL), (b, 3)), dtype=a.dtype,
                          device=dev)

    def residual_of(state):
        return _xp.frobenius_norm(eye - matmul.full(state[1], state[0])) / root_n

    def run(state, coefficients, rounded, *, tol, max_iter, stall_level=None):
        counter = [0]

        def step(state):
            k = counter[0]
            counter[0] += 1
            x, new_state = minimax_step(*state, coefficients(k), first=k == 0 and
                                        coefficients is scheduled, rounded=rounded,
                                        full=matmul.full, eye=eye)
            return _xp.frobenius_norm(eye - x) / root_n, new_state

        return iterate_frozen(state, step, residual_of, tol=tol, max_iter=max_iter,
                              check_every=check_every, stall_level=stall_level)

    def scheduled(k):
        return table[k, ...]

    def tail_only(k):
        return tail

    start = (a, xp.broadcast_to(eye, a.shape))
    zero = xp.zeros((b,), dtype=xp.int32, device=dev)
    if steps > 0:
        tol_main = max(tol, LOW_PRECISION_FLOOR * u) if low and tol > 0 else tol
        outcome = run(start, scheduled, matmul if low else matmul.full, tol=tol_main,
                      max_iter=steps, stall_level=2 * tol_main if low else None)
        # Accepted steps, plus the ZY that checked the last state.
        matmuls = xp.where(outcome.iterations > 0, STEP_MATMULS * outcome.iterations
                           - (STEP_MATMULS - FIRST_STEP_MATMULS) + 1, zero)
    else:
        outcome = IterationOutcome(start, None, zero, None)
        matmuls = zero
    if not low:
        return outcome, matmuls
    polish = run(outcome.state, tail_only, matmul.full, tol=tol,
                 max_iter=max(max_iter - steps, 1) if tol > 0 else 1)
    # Each polish step re-forms its incoming ZY; one more ZY checks the result.
    matmuls = matmuls + STEP_MATMULS * polish.iterations + 1
    return polish._replace(iterations=outcome.iterations + polish.iterations), matmuls


def minimax(a, p: int, *, lower, tol, max_iter, check_every, matmul, **_):
    """``a^(-1/p)`` for ``p = 2^k`` by coupled minimax polynomial iterations.

    Parameters
    ----------
    a : array, shape (b, n, n)
        Regularised, symmetric stack with spectrum in (0, 1].
    p : int
        1 or a power of two.
    lower : array, shape (b,)
        A lower bound on each matrix's spectrum (``eps/scale`` or an estimate).

    Returns
    -------
    SolverOutput
        ``residual`` is the worst stage's ``‖I − ZY‖_F/√n``; ``iterations`` and
        ``matmuls`` add up over the stages.
    """
    xp = _xp.array_namespace(a)
    dev = _xp.device_of(a)
    b = a.shape[0]
    stages = max(1, int(round(math.log2(p))))
    bounds = [float(v) for v in _xp.to_numpy(lower)]
    residual = xp.zeros((b,), dtype=a.dtype, device=dev)
    iterations = xp.zeros((b,), dtype=xp.int32, device=dev)
    matmuls = xp.zeros((b,), dtype=xp.int32, device=dev)
    converged = xp.ones((b,), dtype=xp.bool, device=dev)
    current = a
    for stage in range(stages):
        # Stage s's relative error reaches the root damped by 2^(stages−1−s).
        damping = 2.0 ** (stages - 1 - stage)
        outcome, spent = minimax_sqrt(current, bounds, tol=tol * damping,
                                      max_iter=max_iter, check_every=check_every,
                                      matmul=matmul)
        residual = xp.maximum(residual, outcome.residual / damping)
        iterations = iterations + outcome.iterations
        matmuls = matmuls + xp.astype(spent, xp.int32)
        converged = converged & outcome.converged
        current = outcome.state[0]
        bounds = [STAGE_SLACK * math.sqrt(v) for v in bounds]
    z = outcome.state[1]
    if p == 1:
        return SolverOutput(matmul.full(z, z), residual, iterations, converged, matmuls + 1)
    return SolverOutput(z, residual, iterations, converged, matmuls)
