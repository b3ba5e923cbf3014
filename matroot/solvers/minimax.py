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

Cost per step: ``X = ZY``, the product in ``q`` (evaluated in ``D = X − I``, see
:func:`about_identity`), ``Y·q``, ``q·Z``: 4 matmuls, 2 in the first step
(``X₀ = A``, ``q·Z₀ = q``). Steps to ``max |1 − s| ≤ 1e-3`` in exact
arithmetic, with the margins used here: κ = 1e2: 3, 1e4: 5, 1e6: 7 (Newton–Schulz:
9, 14, 20 at 3 matmuls each). Measured matmuls at the default tol (float32,
n = 256, geometric spectra, eps = 0 so λmin is the Lanczos estimate), with
Newton–Schulz ("newton_db") and coupled Newton for comparison; every run met the
core accuracy targets:

====  ===================  ===================  ===================
p     κ = 1e2              κ = 1e4              κ = 1e6
====  ===================  ===================  ===================
1     16 / 28 / 19         24 / 46 / 33         36 / 64 / 47
2     15 / 27 / 26         23 / 45 / 41         35 / 63 / 59
4     26 / 45 / 31         38 / 72 / 51         54 / 99 / 71
8     37 / 60 / 34         49 / 90 / 59         65 / 123 / 79
====  ===================  ===================  ===================

(minimax / newton_db / coupled_newton). With ``tol`` set to the error wanted
instead of the default, fewer: see ``tests/solvers/test_matmul_targets.py``.

p = 2^k runs k stages: stages 1..k−1 take square roots (their ``Y``), the last an
inverse square root (its ``Z``); each stage's lower bound is the square root of
the previous one's, so the later stages are far better conditioned and cheap.
p = 1 squares ``A^(-1/2)``.

Low precision (``matmul_dtype``): ``D²`` rounds its operands to 16 bits, ``ZY``
and ``q·Z`` do while ``u·‖Z‖`` is small (``‖Z‖`` grows towards ``√κ``, bounded on
the host from the schedule), ``Y·q`` never does (see :func:`minimax_step`); the
16-bit phase stops at its rounding floor and working-precision
:data:`~matroot.solvers.minimax_coefficients.TAIL` steps finish. Relative error
against the float64 oracle (torch CPU, n = 256, rank-deficient A plus a ridge,
p = 2; p = 4 is up to 1.5× smaller), with coupled Newton's 16-bit path and the
former coupled Newton, which rounded every operand, for comparison ("div.":
diverged):

=====================  ========  ========  ========  ========  ========
κ                      1e2       1e3       1e4       1e5       1e6
=====================  ========  ========  ========  ========  ========
minimax float16        2.7e-4    5.4e-4    1.1e-3    2.9e-3    1.0e-2
minimax bfloat16       2.2e-3    4.0e-3    7.4e-3    1.4e-2    3.0e-2
coupled Newton fp16    8.1e-4    1.1e-3    1.4e-3    2.1e-3    1.1e-2
coupled Newton bf16    6.6e-3    9.2e-3    1.1e-2    1.3e-2    2.0e-2
former coupled, fp16   2.3e-3    1.8e-2    1.7e-1    div.      div.
former coupled, bf16   1.8e-2    1.8e-1    div.      div.      div.
=====================  ========  ========  ========  ========  ========

So for a 1e-2 error budget float16 is safe up to κ ≈ 1e6 (eps ≳ 1e-6·λmax) and
bfloat16 up to κ ≈ 1e4 (eps ≳ 1e-4·λmax); for 1e-3, float16 up to κ ≈ 1e4 and
bfloat16 not at all. Errors of the 16-bit phase that break ``Y = A·Z`` are not
undone by the working-precision steps, so these are floors, not tolerances.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _xp
from ..certify.accuracy import unit_roundoff
from ._low_precision import LowPrecisionPhase, run_phases
from ._stages import StageOutcome, square_root_stages, stage_count
from .registry import POWER_OF_TWO_P, SolverSpec
from ._lower_grid import quantize_lower
from .minimax_coefficients import (SMALLEST_LOWER, TAIL_ABOUT_IDENTITY,
                                   device_coefficient_table, host_coefficient_table,
                                   rounding_margin, schedule, schedule_grid, z_norm_bounds)

#: Matmuls of the first step (``X₀ = A``, ``Z₀ = I``) and of every later one.
FIRST_STEP_MATMULS = 2
STEP_MATMULS = 4
#: With 16-bit operands the residual, formed from a 16-bit ``ZY``, bottoms out
#: near ``8u`` (measured, float16 and bfloat16): the 16-bit phase stops at
#: ``16u`` or when it stalls below twice that.
LOW_PRECISION = LowPrecisionPhase(floor=16.0, stall_ratio=2.0)
#: The 16-bit phase runs at most the longest schedule of the stack plus this
#: many ``TAIL`` steps (:mod:`~matroot.solvers.minimax_coefficients`); working-precision
#: TAIL steps finish (at least one).
LOW_PRECISION_EXTRA_STEPS = 2
#: ``ZY`` and ``q·Z`` round their operands only while ``u·‖Z‖`` stays below this
#: (bfloat16: ‖Z‖ ≤ 25, float16: ‖Z‖ ≤ 200). Measured, p = 2 and 4, κ = 1e4 to
#: 1e6: limits of 0.25 to 100 gave up to 2× larger errors (bfloat16, p = 4,
#: κ = 1e6 diverged with no limit), 0.03 improved on 0.1 by at most 1.3×.
Z_ROUNDING_LIMIT = 0.1
#: Slack on the next stage's lower bound for the previous stage's residual error.
STAGE_SLACK = 0.9


def minimax_step(y, z, coeff, *, first, z_minus_eye, z_product, y_product, polynomial,
                 eye):
    """One coupled step ``D = ZY − I``, ``q = α + βD + γD²``, ``Y ← Y·q``, ``Z ← q·Z``.

    ``coeff`` is ``(α, β, γ)``, the step's polynomial about the identity
    (:func:`about_identity`): Python floats shared by the stack, or per-matrix
    arrays of shape (b, 1, 1). ``z_minus_eye(Z, Y)`` forms ``ZY − I`` (one fused
    product on torch), ``polynomial(D, α, β, γ)`` forms ``q`` (with its product).
    ``first`` marks the step from ``Z = I`` (``D = Y − I``, ``q·Z = q``: 2
    matmuls instead of 4). The callables form the products, so that a 16-bit
    policy can differ per product: ``z_minus_eye`` and ``z_product`` for ``ZY``
    and ``q·Z``, ``polynomial`` for ``D²``, ``y_product`` for ``Y·q``. Measured
    with 16-bit operands: rounding ``Y`` (``Y₀ = A``) moves its small eigenvalues
    by ``u·λmax``, which no later step undoes (float16, κ = 1e4: 6e-2 relative
    error), rounding ``X`` costs a few ``u``, rounding ``Z`` costs about ``u·‖Z‖``.

    Returns
    -------
    (D, advance)
        The incoming ``ZY − I`` (for the residual) and a callable that forms the
        next iterates ``(Y, Z)`` (the loop skips it once every matrix is done).
    """
    d = y - eye if first else z_minus_eye(z, y)

    def advance():
        q = polynomial(d, *coeff)
        return y_product(y, q), q if first else z_product(q, z)

    return d, advance


def minimax_sqrt(a, lower, *, tol, max_iter, check_every, matmul, margin=None):
    """Coupled minimax iteration: ``Y → a^(1/2)``, ``Z → a^(-1/2)``.

    Parameters
    ----------
    a : array, shape (b, n, n)
        Symmetric stack with spectrum in ``[lower, 1]`` (the first step has
        headroom up to ``λ = 1.21``).
    lower : sequence of float, length b
        Host-side lower bounds on each matrix's spectrum; under ``jax.jit`` a
        device array of shape (b,) instead.
    tol, max_iter, check_every
        As in :func:`matroot.solvers._iteration.iterate_frozen`; the residual is
        ``‖I − ZY‖_F/√n``. ``tol = 0`` runs exactly ``max_iter`` steps.
    matmul : matroot._xp.Matmul
        Products. With a 16-bit operand dtype, ``D²`` always rounds its
        operands, ``ZY`` and ``q·Z`` while ``u·‖Z‖ ≤ Z_ROUNDING_LIMIT`` (bounded
        on the host from the schedule) and ``Y·q`` never. That phase runs until
        the residual reaches ``LOW_PRECISION.floor·u16`` or stalls, for at most
        the schedule's length plus ``LOW_PRECISION_EXTRA_STEPS``; then
        :data:`~matroot.solvers.minimax_coefficients.TAIL` steps in the working
        dtype finish (at least one; ``max_iter`` caps the total).
    margin : float, optional
        Rounding headroom of the schedule; default ``√u`` of the operand dtype.

    Returns
    -------
    (IterationOutcome, matmuls)
        ``state == (Y, Z)``; ``matmuls`` is the per-matrix count, shape (b,).

    Examples
    --------
    >>> import numpy as np
    >>> from matroot import _xp
    >>> from matroot.solvers.minimax import minimax_sqrt
    >>> a = np.diag([0.01, 0.25, 1.0])[None]
    >>> outcome, matmuls = minimax_sqrt(a, [0.01], tol=1e-12, max_iter=30,
    ...                                 check_every=1, matmul=_xp.Matmul(np))
    >>> y, z = outcome.state
    >>> np.round(np.diag(y[0]), 6), np.round(np.diag(z[0]), 6), matmuls.tolist()
    (array([0.1, 0.5, 1. ]), array([10.,  2.,  1.]), [19])
    """
    xp = _xp.array_namespace(a)
    dev = _xp.device_of(a)
    n = a.shape[-1]
    eye = _xp.identity_stack(xp, n, a.dtype, dev)
    root_n = math.sqrt(n)
    low = matmul.operand_dtype is not None
    u = unit_roundoff(xp, matmul.operand_dtype if low else a.dtype)
    if margin is None:
        margin = rounding_margin(u)
    traced = _xp.is_traced(a)
    # Traced (jax.jit, torch.compile): the bounds stay on the device and index
    # the grid's schedules.
    lowers = lower if traced else [quantize_lower(v, SMALLEST_LOWER) for v in lower]
    if low and not traced and len(set(lowers)) > 1:
        # The 16-bit step count and Z policy are shared by a stack: one group per
        # bound, so no neighbour changes a matrix's bits (issue 36).
        return _per_bound(a, lower, lowers, lambda sub, bounds: minimax_sqrt(
            sub, bounds, tol=tol, max_iter=max_iter, check_every=check_every,
            matmul=matmul, margin=margin))
    steps = max_iter
    if low and tol == 0:
        steps = max_iter - 1
    elif low:
        # More 16-bit steps than the schedule plus two TAIL steps cannot help,
        # and at κ ≳ 1e6 dozens of them drift (bfloat16 diverged). Traced: the
        # longest schedule of the grid.
        longest = (schedule_grid(margin)[1].shape[1] if traced
                   else max(len(schedule(v, margin).errors) for v in lowers))
        steps = min(max_iter - 1, longest + LOW_PRECISION_EXTRA_STEPS)
    # Per-matrix rows travel with the iterates (as (b, steps, 3, 1, 1): a step's
    # coefficients are then (b, 1, 1) stacks in two operations), so that the loop's
    # compaction to the active matrices keeps them aligned.
    if traced:
        host_table = shared_rows = None
        table = device_coefficient_table(xp, lowers, margin, steps, a.dtype, dev)
    else:
        host_table = host_coefficient_table(lowers, margin, steps)
        shared_rows = np.all(host_table == host_table[:, :1], axis=(1, 2))
        table = _xp.from_numpy(xp, np.transpose(host_table, (1, 0, 2)), dtype=a.dtype,
                               device=dev)
    table = xp.reshape(table, (*table.shape, 1, 1))

    def residual_of(state):
        # ‖I − ZY‖_F; the loop divides by √n once, at the end.
        return _xp.frobenius_norm(eye - matmul.full(state[1], state[0]))

    # The ‖Z‖ bound needs host bounds; under jax.jit ZY and q·Z stay unrounded.
    z_rounding = None if traced else (
        u * z_norm_bounds(lowers, margin, max(steps, 1)) <= Z_ROUNDING_LIMIT)

    def fused_polynomial(d, alpha, beta, gamma):
        # α·I + D·(β·I + γ·D): two operations besides the fused product where the
        # coefficients are shared floats (each full-size temporary costs a pass).
        return matmul.shifted(alpha, 1.0, d, _xp.add_scaled(beta * eye, gamma, d), eye,
                              full=True)

    def rounded_polynomial(d, alpha, beta, gamma):
        # D² from 16-bit operands, the sum in the working dtype.
        return alpha * eye + beta * d + gamma * matmul(d, d)

    def coefficients(rows, k, main):
        if not main:
            return TAIL_ABOUT_IDENTITY
        if host_table is not None and shared_rows[k]:
            return tuple(float(v) for v in host_table[k, 0])
        return xp.unstack(rows[:, k, ...], axis=1)

    def step(state, k, main):
        y, z, rows = state
        sixteen_bit = low and main
        round_z = sixteen_bit and not traced and bool(z_rounding[k])
        d, advance = minimax_step(
            y, z, coefficients(rows, k, main),
            first=main and isinstance(k, int) and k == 0,  # k is traced from 1 on under jit
            z_minus_eye=lambda left, right: matmul.added(eye, left, right, beta=-1.0,
                                                         full=not round_z),
            z_product=matmul if round_z else matmul.full, y_product=matmul.full,
            polynomial=rounded_polynomial if sixteen_bit else fused_polynomial, eye=eye)
        return _xp.frobenius_norm(d), lambda: (*advance(), rows)

    phased = run_phases((a, xp.broadcast_to(eye, a.shape), table), step, residual_of,
                        matmul=matmul, tol=tol, main_steps=steps,
                        polish_steps=max(max_iter - steps, 1), check_every=check_every,
                        phase=LOW_PRECISION, residual_scale=1 / root_n)
    main = phased.main_iterations
    # Accepted steps, plus the ZY that checked the last state.
    matmuls = xp.where(main > 0, STEP_MATMULS * main - (STEP_MATMULS - FIRST_STEP_MATMULS) + 1,
                       xp.zeros_like(main))
    if low:
        # Each polish step re-forms its incoming ZY; one more ZY checks the result.
        matmuls = matmuls + STEP_MATMULS * phased.polish_iterations + 1
    return phased.outcome._replace(state=phased.outcome.state[:2]), matmuls


def _per_bound(a, lower, keys, solve):
    """``solve`` on each group of matrices with one quantized bound, stitched back
    in order."""
    xp = _xp.array_namespace(a)
    groups = [[i for i, k in enumerate(keys) if k == key] for key in sorted(set(keys))]
    parts = [solve(xp.take(a, xp.asarray(g, device=_xp.device_of(a)), axis=0),
                   [lower[i] for i in g]) for g in groups]
    inverse = xp.asarray(np.argsort(np.concatenate(groups)), device=_xp.device_of(a))

    def stitch(arrays):
        return xp.take(xp.concat(list(arrays), axis=0), inverse, axis=0)

    outcomes = [outcome for outcome, _ in parts]
    state = tuple(stitch(o.state[j] for o in outcomes) for j in range(len(outcomes[0].state)))
    fields = (stitch(getattr(o, f) for o in outcomes) for f in ("residual", "iterations",
                                                                "converged"))
    return (outcomes[0]._replace(state=state, **dict(zip(("residual", "iterations",
                                                          "converged"), fields))),
            stitch(m for _, m in parts))


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
        ``residual`` is the worst stage's ``‖I − ZY‖_F/√n`` divided by
        ``2^(k−1−s)`` (stage s's error is damped by that factor in the root, so
        its ``tol`` is multiplied by it); ``iterations`` and ``matmuls`` add up
        over the stages.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot import _xp
    >>> from matroot.solvers.minimax import minimax
    >>> a = np.diag([1 / 16, 1 / 81, 1.0])[None]
    >>> out = minimax(a, 4, lower=np.array([1 / 81]), tol=1e-12, max_iter=30,
    ...               check_every=1, matmul=_xp.Matmul(np))
    >>> np.round(np.diag(out.root[0]), 6), out.iterations.tolist()
    (array([2., 3., 1.]), [9])
    """
    xp = _xp.array_namespace(a)
    traced = _xp.is_traced(a)
    bounds = lower if traced else [float(v) for v in _xp.to_numpy(lower)]

    def run_stage(current, stage, stages):
        nonlocal bounds
        # Stage s's relative error reaches the root damped by 2^(stages−1−s).
        damping = 2.0 ** (stages - 1 - stage)
        outcome, spent = minimax_sqrt(current, bounds, tol=tol * damping,
                                      max_iter=max_iter, check_every=check_every,
                                      matmul=matmul)
        bounds = (STAGE_SLACK * xp.sqrt(bounds) if traced
                  else [STAGE_SLACK * math.sqrt(v) for v in bounds])
        return StageOutcome(*outcome.state, outcome.residual / damping, outcome.iterations,
                            outcome.converged, xp.astype(spent, xp.int32))

    return square_root_stages(a, p, run_stage, square=matmul.full)


#: The smallest ``s = √λ`` grows about ×4.3 per step; about two cubic steps
#: then reach the float32 default tol.
_GROWTH_PER_STEP = 4.3
_CUBIC_STEPS = 2


def _cost(p, kappa) -> float:
    total = 0.0
    for j in range(stage_count(p)):
        steps = math.log(kappa ** (0.5 ** (j + 1))) / math.log(_GROWTH_PER_STEP) + _CUBIC_STEPS
        total += STEP_MATMULS * steps - (STEP_MATMULS - FIRST_STEP_MATMULS) + 1
    return total + (p == 1)


SPEC = SolverSpec(
    name="minimax",
    solve=minimax,
    summary="GPUs, p = 2 or 4: the fewest matmuls; κ ≲ 1e4 for errors ≲ 1e-4, "
            "fp16 matmuls to κ ≈ 1e4",
    root_orders=POWER_OF_TWO_P,
    default_tol={"float32": 1e-5, "float64": 1e-12},
    default_max_iter=30,
    cost=_cost,
    cost_summary="4 per step (2 in the first), one stage per factor of two in p",
    needs_lower_bound=True,
    fixed_steps=True,
)
