"""Coupled inverse Newton iteration (Guo–Higham) for A^(-1/p), any integer p ≥ 1."""

from __future__ import annotations

import math

from .. import _xp
from ._iteration import iterate_frozen
from ._result import SolverOutput


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


def coupled_newton(a, p: int, *, tol, max_iter, check_every, matmul, **_):
    """``a^(-1/p)`` by the coupled inverse Newton iteration.

    With ``X₀ = I`` and ``M₀ = a`` each step forms ``N = ((p+1)I − M)/p``,
    ``X ← XN`` and ``M ← N^p M``; ``M → I`` and ``X → a^(-1/p)``. The basin is a
    spectrum in (0, p+1); matroot hands it ``a`` scaled into (0, 1]. The residual
    is ``‖I − M‖_F / √n``, which costs no matmul.

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

    def residual_of(state):
        return _xp.frobenius_norm(eye - state[1]) / root_n

    def step(state):
        x, m = state
        step_matrix = ((p + 1) * eye - m) / p
        return residual_of(state), (matmul(x, step_matrix),
                                    matmul(matrix_power(step_matrix, p, matmul), m))

    x0 = xp.broadcast_to(eye, a.shape)
    outcome = iterate_frozen((x0, a), step, residual_of, tol=tol, max_iter=max_iter,
                             check_every=check_every)
    per_step = 2 + power_matmuls(p)
    return SolverOutput(outcome.state[0], outcome.residual, outcome.iterations,
                        outcome.converged, per_step * outcome.iterations)
