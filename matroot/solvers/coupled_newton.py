"""Coupled inverse Newton iteration (Guo–Higham) for A^(-1/p), any integer p ≥ 1."""

from __future__ import annotations

import math

from .. import _xp
from ._iteration import IterationOutcome, iterate_frozen
from ._result import SolverOutput

#: With 16-bit operands the residual bottoms out near their unit roundoff u
#: (measured, float16 and bfloat16): the 16-bit phase stops at
#: ``LOW_PRECISION_FLOOR·u`` or when it stalls below four times that.
LOW_PRECISION_FLOOR = 2.0
#: Working-precision steps after a 16-bit phase (quadratic convergence from 2u).
POLISH_STEPS = 3


def matrix_power(x, p: int, matmul):
    """``x^p`` for integer ``p ≥ 1`` by binary powering (about log2(p) matmuls)."""
    result = None
    base = x
    while True:
        if p & 1:
            result = base if result is None else matmul(result, base)
        p >>= 1
        if not p:
            return result
        base = matmul(base, base)


def power_matmuls(p: int) -> int:
    """Matmuls :func:`matrix_power` forms for exponent ``p``."""
    return p.bit_length() - 1 + bin(p).count("1") - 1


def initial_scale(p: int) -> float:
    """Where λmax of the scaled stack is mapped: ``t = (p+1)/2``, mid-basin.

    Measured iterations to ``tol = 1e-5`` in float32 (n = 256, log-uniform
    spectra, with or without a ridge), former ``t = 1`` → ``t = (p+1)/2``:

    ====  ==========  ==========  ==========
    p     κ = 1e2     κ = 1e4     κ = 1e6
    ====  ==========  ==========  ==========
    2     9 → 9       15 → 14     21 → 20
    4     9 → 8       14 → 13     19 → 18
    8     8 → 7       13 → 12     18 → 16
    ====  ==========  ==========  ==========

    (p = 1 is unchanged, t = 1.) Guo–Higham's choice for a known interval
    ``[λn, λ1]``, ``t = (p+1)(α^(1/p) − 1)/(α^(1/p)·λ1 − λn)`` with ``α = λ1/λn``,
    saves at most one more step in exact arithmetic, but it tends to p+1 (the
    basin's edge) as λn → 0: with λmax 3.5% above its estimate, p = 4 at κ = 1e6
    then needs 29 steps instead of 18, and p = 1 diverges.
    """
    return (p + 1) / 2


def coupled_newton(a, p: int, *, tol, max_iter, check_every, matmul, **_):
    """``a^(-1/p)`` by the coupled inverse Newton iteration.

    With ``t = (p+1)/2``, ``X₀ = t^(1/p)·I`` and ``M₀ = t·a`` each step forms
    ``N = ((p+1)I − M)/p``, ``X ← XN`` and ``M ← N^p M``; ``M → I`` and
    ``X → a^(-1/p)``. The basin is a spectrum of ``M₀`` in (0, p+1); matroot hands
    the solver ``a`` scaled into (0, 1], so λmax lands mid-basin, which saves one
    to two steps over mapping it to 1 (see :func:`initial_scale`). The residual is
    ``‖I − M‖_F / √n``, which costs no matmul; the first ``X·N`` is a scaling.

    With 16-bit ``matmul`` operands, ``X·N`` and ``N^p`` round their operands
    (``N`` is bounded, and ``X``'s rounding only costs a few ``u`` in the relative
    error) while ``N^p·M`` stays in the working dtype: rounding ``M₀ = t·a`` to 16
    bits moves its small eigenvalues by ``u·λmax``, an error of order ``u·κ``.
    float16, p = 2, κ = 1e4 (n = 256, rank-deficient A plus a ridge): 1.4e-3
    relative error this way, 1.7e-1 with every operand rounded; the table in
    :mod:`matroot.solvers.minimax` has κ = 1e2…1e6 for both precisions. The
    16-bit phase stops at ``2u`` (or when the residual stalls below ``8u``);
    working-precision steps finish (at least one).

    Parameters
    ----------
    a : array, shape (b, n, n)
        Regularised, symmetric stack with spectrum in (0, 1].
    p : int
        Root order, ≥ 1.

    Returns
    -------
    SolverOutput
    """
    xp = _xp.array_namespace(a)
    b, n = a.shape[0], a.shape[-1]
    eye = _xp.identity_stack(xp, n, a.dtype, _xp.device_of(a))
    root_n = math.sqrt(n)
    low = matmul.operand_dtype is not None
    t = initial_scale(p)
    x_scale = t ** (1.0 / p)
    per_step = 2 + power_matmuls(p)

    def residual_of(state):
        return _xp.frobenius_norm(eye - state[1]) / root_n

    def run(state, rounded, *, first, tol, max_iter, stall_level=None):
        def step(state, k):
            x, m = state
            shortcut = first and isinstance(k, int) and k == 0
            step_matrix = ((p + 1) * eye - m) / p
            new_x = x_scale * step_matrix if shortcut else rounded(x, step_matrix)
            new_m = matmul.full(matrix_power(step_matrix, p, rounded), m)
            return residual_of(state), (new_x, new_m)

        return iterate_frozen(state, step, residual_of, tol=tol, max_iter=max_iter,
                              check_every=check_every, stall_level=stall_level)

    start = (xp.broadcast_to(eye * x_scale, a.shape), a * t)
    zero = xp.zeros((b,), dtype=xp.int32, device=_xp.device_of(a))
    steps = max_iter - 1 if low else max_iter
    if steps > 0:
        u = float(xp.finfo(matmul.operand_dtype).eps) / 2 if low else 0.0
        tol_main = max(tol, LOW_PRECISION_FLOOR * u) if low and tol > 0 else tol
        outcome = run(start, matmul if low else matmul.full, first=True, tol=tol_main,
                      max_iter=steps, stall_level=4 * tol_main if low else None)
        # The first X·N is a scaling, not a product.
        matmuls = xp.where(outcome.iterations > 0, per_step * outcome.iterations - 1, zero)
    else:
        outcome = IterationOutcome(start, None, zero, None)
        matmuls = zero
    if low:
        polish = run(outcome.state, matmul.full, first=False, tol=tol,
                     max_iter=POLISH_STEPS if tol > 0 else 1)
        matmuls = matmuls + per_step * polish.iterations
        outcome = polish._replace(iterations=outcome.iterations + polish.iterations)
    return SolverOutput(outcome.state[0], outcome.residual, outcome.iterations,
                        outcome.converged, matmuls)
