"""Coupled Newton–Schulz iteration ("Newton-DB" in DASH) for A^(±1/2), and A^(-1/p)
for p a power of two by repeated square roots."""

from __future__ import annotations

import math

from .. import _xp
from ..certify.accuracy import unit_roundoff
from ..spectrum.scaling import lambda_max_bound_core
from ._iteration import iterate_frozen
from ._stages import StageOutcome, square_root_stages, stage_count
from .registry import POWER_OF_TWO_P, SolverSpec

MATMULS_PER_STEP = 3
#: With 16-bit operands the residual bottoms out at a few units of their roundoff
#: u (bfloat16: ~1e-2, far above any float32 tol): a step that fails to halve it
#: below this many u is a stall. The stop is only a stop; whether the root is
#: right is decided afterwards by :mod:`matroot.certify.verify`.
LOW_PRECISION_STALL = 8.0


def newton_schulz_sqrt(a, *, tol, max_iter, check_every, matmul):
    """Coupled Newton–Schulz: ``Y → a^(1/2)``, ``Z → a^(-1/2)`` for a stack ``a``.

    ``a`` must have its spectrum in (0, 3) (matroot scales it into (0, 1]). Each
    step forms ``E = (3I − ZY)/2``, ``Y ← YE``, ``Z ← EZ``: three matmuls. The
    residual is ``‖I − ZY‖_F / √n``, available from the step's own product.

    Returns
    -------
    IterationOutcome
        ``state == (Y, Z)`` plus per-matrix residual, iterations and converged.
    """
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    eye = _xp.identity_stack(xp, n, a.dtype, _xp.device_of(a))
    root_n = math.sqrt(n)

    def step(state, k):
        y, z = state
        e = matmul.shifted(1.5, -0.5, z, y, eye)
        return _xp.frobenius_norm(e - eye), lambda: (matmul(y, e), matmul(e, z))

    def residual_of(state):
        y, z = state
        return _xp.frobenius_norm(eye - matmul(z, y)) * 0.5

    z0 = xp.broadcast_to(eye, a.shape)
    stall_level = None
    if matmul.operand_dtype is not None and tol > 0:
        u = unit_roundoff(xp, matmul.operand_dtype)
        stall_level = max(tol ** 0.5, LOW_PRECISION_STALL * u)
    # The loop judges ‖E − I‖_F = ‖I − ZY‖_F/2 and scales the record once.
    return iterate_frozen((a, z0), step, residual_of, tol=tol, max_iter=max_iter,
                          check_every=check_every, stall_level=stall_level,
                          residual_scale=2 / root_n)


def newton_db(a, p: int, *, tol, max_iter, check_every, matmul, scaling="power", **_):
    """``a^(-1/p)`` for ``p = 2^k`` by k coupled Newton–Schulz square roots.

    Stage j takes the square root of the previous stage's square root, so its
    condition number is the square root of the previous one; each stage is
    rescaled by its own λmax estimate. p = 1 squares ``a^(-1/2)``.

    Parameters
    ----------
    a : array, shape (b, n, n)
        Regularised, symmetric stack with spectrum in (0, 1].
    p : int
        A power of two.

    Returns
    -------
    SolverOutput
    """
    xp = _xp.array_namespace(a)

    def run_stage(current, stage, stages):
        outcome = newton_schulz_sqrt(current, tol=tol, max_iter=max_iter,
                                     check_every=check_every, matmul=matmul)
        return StageOutcome(*outcome.state, outcome.residual, outcome.iterations,
                            outcome.converged, MATMULS_PER_STEP * outcome.iterations)

    def rescale(y):
        # The stage's rescale need not be certified: a bound that comes out low only
        # slows or spoils this stage, which the final check of the root then reports;
        # a Cholesky test per stage would cost a factorisation each.
        c = lambda_max_bound_core(y, scaling=scaling, bound_certificate="randomized")
        return xp.where(c > 0, c, xp.ones_like(c))

    return square_root_stages(a, p, run_stage, square=matmul, rescale=rescale)


#: A small eigenvalue of the scaled stack grows about ×2.25 per step until it is
#: near 1; about four quadratic steps then reach the float32 default tol.
_GROWTH_PER_STEP = 2.25
_QUADRATIC_STEPS = 4


def _cost(p, kappa) -> float:
    steps = sum(math.log(kappa ** 0.5 ** j) / math.log(_GROWTH_PER_STEP) + _QUADRATIC_STEPS
                for j in range(stage_count(p)))
    return MATMULS_PER_STEP * steps + (p == 1)


SPEC = SolverSpec(
    name="newton_db",
    solve=newton_db,
    summary="GPUs, p = 2 or 4, float32 matmuls; κ ≲ 1e4 for errors ≲ 1e-4",
    root_orders=POWER_OF_TWO_P,
    default_tol={"float32": 1e-5, "float64": 1e-12},
    default_max_iter=60,
    cost=_cost,
    cost_summary="3 per step, one square root per factor of two in p",
    fixed_steps=True,
)
