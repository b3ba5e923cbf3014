"""Coupled inverse Newton iteration (Guo–Higham) for A^(-1/p), any integer p ≥ 1."""

from __future__ import annotations

import math

from .. import _xp
from .._xp import matrix_power, power_matmuls
from ._low_precision import LowPrecisionPhase, run_phases
from ._result import SolverOutput
from .registry import INTEGER_P, SolverSpec

#: With 16-bit operands the residual ``‖I − M‖`` bottoms out near their unit
#: roundoff u (measured, float16 and bfloat16): the 16-bit phase stops at
#: ``2u`` or when it stalls below four times that.
LOW_PRECISION = LowPrecisionPhase(floor=2.0, stall_ratio=4.0)
#: Working-precision steps after a 16-bit phase (quadratic convergence from 2u).
POLISH_STEPS = 3



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
    n = a.shape[-1]
    eye = _xp.identity_stack(xp, n, a.dtype, _xp.device_of(a))
    root_n = math.sqrt(n)
    low = matmul.operand_dtype is not None
    t = initial_scale(p)
    x_scale = t ** (1.0 / p)
    per_step = 2 + power_matmuls(p)

    def residual_of(state):
        # ‖I − M‖_F; the loop divides by √n once, at the end.
        return _xp.frobenius_norm(eye - state[1])

    # N = ((p+1)·I − M)/p as (p+1)/p·I − M/p: one operation, the same bits for p a
    # power of two (the scalings are exact).
    shifted_eye = ((p + 1) / p) * eye

    def step(state, k, main):
        x, m = state
        rounded = matmul if low and main else matmul.full

        def advance():
            step_matrix = _xp.add_scaled(shifted_eye, -1.0 / p, m)
            # The first X·N is a scaling, not a product.
            first = main and isinstance(k, int) and k == 0  # k is traced from 1 on under jit
            new_x = x_scale * step_matrix if first else rounded(x, step_matrix)
            return new_x, matmul.full(matrix_power(step_matrix, p, rounded), m)

        return residual_of(state), advance

    start = (xp.broadcast_to(eye * x_scale, a.shape), a * t)
    phased = run_phases(start, step, residual_of, matmul=matmul, tol=tol,
                        main_steps=max_iter - 1 if low else max_iter,
                        polish_steps=POLISH_STEPS, check_every=check_every,
                        phase=LOW_PRECISION, residual_scale=1 / root_n)
    main = phased.main_iterations
    matmuls = xp.where(main > 0, per_step * main - 1, xp.zeros_like(main))
    outcome = phased.outcome
    return SolverOutput(outcome.state[0], outcome.residual, outcome.iterations,
                        outcome.converged, matmuls + per_step * phased.polish_iterations)


#: Measured steps to the float32 default tol grow by about 5 per factor 100 in κ
#: (9, 14, 19 at κ = 1e2, 1e4, 1e6 for p = 2; see :func:`initial_scale`).
_GROWTH_PER_STEP = 2.5
_QUADRATIC_STEPS = 3


def _cost(p, kappa) -> float:
    steps = math.log(kappa) / math.log(_GROWTH_PER_STEP) + _QUADRATIC_STEPS
    return (2 + power_matmuls(p)) * steps - 1


SPEC = SolverSpec(
    name="coupled_newton",
    solve=coupled_newton,
    summary="GPUs, any integer p, 16-bit matmuls; κ ≲ 1e4 for errors ≲ 1e-4",
    root_orders=INTEGER_P,
    default_tol={"float32": 1e-5, "float64": 1e-12},
    default_max_iter=60,
    cost=_cost,
    cost_summary="2 + ⌊log₂p⌋ + popcount(p) − 1 per step (4 for p = 4)",
    fixed_steps=True,
)
