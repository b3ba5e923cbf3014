"""Coupled Newton–Schulz iteration ("Newton-DB" in DASH) for A^(±1/2), and A^(-1/p)
for p a power of two by repeated square roots."""

from __future__ import annotations

import math

from .. import _xp
from ..scaling import lambda_max_bound
from ._iteration import iterate_frozen
from ._result import SolverOutput

MATMULS_PER_STEP = 3


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
        res = _xp.frobenius_norm(2 * (e - eye)) / root_n
        return res, (matmul(y, e), matmul(e, z))

    def residual_of(state):
        y, z = state
        return _xp.frobenius_norm(eye - matmul(z, y)) / root_n

    z0 = xp.broadcast_to(eye, a.shape)
    return iterate_frozen((a, z0), step, residual_of, tol=tol, max_iter=max_iter,
                          check_every=check_every)


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
    stages = max(1, int(round(math.log2(p))))
    dev = _xp.device_of(a)
    b = a.shape[0]
    residual = xp.zeros((b,), dtype=a.dtype, device=dev)
    iterations = xp.zeros((b,), dtype=xp.int32, device=dev)
    converged = xp.ones((b,), dtype=xp.bool, device=dev)
    # Invariant: the answer is (factor * current)^(-1/2).
    current = a
    factor = xp.ones((b,), dtype=a.dtype, device=dev)
    for stage in range(stages):
        if stage > 0:
            c = lambda_max_bound(y, scaling=scaling)
            c = xp.where(c > 0, c, xp.ones_like(c))
            current = y / c[:, None, None]
            factor = xp.sqrt(factor) * c
        outcome = newton_schulz_sqrt(current, tol=tol, max_iter=max_iter,
                                     check_every=check_every, matmul=matmul)
        y, z = outcome.state
        residual = xp.maximum(residual, outcome.residual)
        iterations = iterations + outcome.iterations
        converged = converged & outcome.converged
    matmuls = MATMULS_PER_STEP * iterations
    if p == 1:
        return SolverOutput(matmul(z, z), residual, iterations, converged, matmuls + 1)
    root = z / xp.sqrt(factor)[:, None, None]
    return SolverOutput(root, residual, iterations, converged, matmuls)
