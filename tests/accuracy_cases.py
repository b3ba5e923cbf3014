"""The README accuracy table's cases, shared by the tests that sweep it
(``accuracy/test_accuracy_table.py``, ``accuracy/test_converged_means_right.py``,
``backends/test_jax.py``): its κ buckets, its (method, p) cells, its entries, and the
SPD problems they are measured on."""

from __future__ import annotations

import numpy as np

from matroot.solvers.registry import SOLVERS, solvers_supporting
from matroot.testing import KAPPA_BUCKETS, accuracy_tolerance, spd_stack

KAPPAS = KAPPA_BUCKETS


def target(method, dtype, kappa, p):
    """The README table's entry (matroot.testing holds the table)."""
    return accuracy_tolerance(dtype, kappa, p, method=method)


CASES = [
    (method, p)
    for p in (1, 2, 3, 4, 8)
    for method in SOLVERS
    if method in solvers_supporting(p)
]


#: The ridge of κ = 1e2's table problem (``2.5 / (κ - 1)``), which
#: :func:`one_ridge_for_every_kappa` gives every κ's problem.
SHARED_RIDGE = 2.5 / (KAPPAS[0] - 1)


def one_ridge_for_every_kappa(a, eps):
    """The problem ``(a, eps)`` scaled so that its ridge is :data:`SHARED_RIDGE`:
    ``s·A + s·eps·I`` has the κ of ``A + eps·I`` (every solver is scale-invariant, and
    the oracle is taken of the values passed). Eager JAX compiles one program per
    ``eps`` (a static option of the call), so the table's κ buckets then share one
    compile per (method, p, dtype) instead of one each."""
    if not eps:
        return a, eps
    return a * (SHARED_RIDGE / eps), SHARED_RIDGE


def table_problem(kappa, n, *, with_eps, seed):
    """SPD stack with κ(A + eps·I) = kappa; with_eps: a PSD Gram-like A plus a ridge."""
    rng = np.random.default_rng(seed)
    if not with_eps:
        a, _, _ = spd_stack(rng, (3,), n, kappa, lam_max=2.5)
        return a, 0.0
    a, _, _ = spd_stack(rng, (3,), n, kappa, lam_max=2.5)
    lam, q = np.linalg.eigh(a)
    lam[..., : max(1, n // 4)] = 0.0  # rank-deficient, as Shampoo factors are
    eps = 2.5 / (kappa - 1)
    return (q * lam[..., None, :]) @ np.swapaxes(q, -1, -2), eps
