"""How far two results of one problem may differ when only their rounding differs.

XLA compiles each batch size (and jit vs. op-by-op) into its own program, and BLAS
kernels, thread counts and fused operations round differently; none of them promises
bitwise equality between programs. Two runs of the same solve, same schedule, differ by
rounding amplified by the problem: each of the ~n-term sums in a product is off by
about n·u relative, and the inverse root passes a relative perturbation of A on with a
factor of at most κ/p ≤ κ (in the eigenbasis the Fréchet derivative of x^(-1/p) is the
Schur product with its divided differences, all at most λmin^(-1/p-1)/p, so the relative
condition number in the Frobenius norm is at most λmax/(p·λmin)). ``ROUNDING_SLACK``
covers the handful of products per step whose errors add.
"""

from __future__ import annotations

import numpy as np

ROUNDING_SLACK = 8


def rounding_tolerance(dtype, kappa: float, n: int) -> float:
    """Relative Frobenius distance two same-schedule solves may show from rounding alone."""
    unit_roundoff = float(np.finfo(np.dtype(str(dtype).rsplit(".", 1)[-1])).eps) / 2
    return ROUNDING_SLACK * n * unit_roundoff * kappa


def relative_distance(x, y) -> np.ndarray:
    """Per-matrix ‖x − y‖_F / ‖y‖_F over the last two axes (a vector or scalar is one
    "matrix"), in float64 on the host."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    return np.linalg.norm(x - y, axis=(-2, -1)) / np.linalg.norm(y, axis=(-2, -1))
