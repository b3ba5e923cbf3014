"""The accuracy table of the README, checked against the float64 eigh oracle.

Relative Frobenius error of ``inv_root`` with each method's default tolerance, for
κ(A + eps·I) ∈ {1e2, 1e4, 1e6}, p ∈ {1, 2, 3, 4, 8} (where the method supports p),
float32 and float64, on every backend. The oracle is taken of the values actually
passed (the float32-rounded matrix for float32 input), so the error measured is
the solver's own.
"""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot.solvers.registry import SOLVERS
from matroot.testing import oracle_inv_root, relative_error, spd_stack

from accuracy_cases import CASES, KAPPAS, one_ridge_for_every_kappa, target, table_problem
from conftest import to_numpy


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kappa", KAPPAS, ids=lambda k: f"kappa{k:.0e}")
@pytest.mark.parametrize("method,p", CASES, ids=lambda v: str(v))
def test_accuracy_table(backend, method, p, kappa, dtype):
    tol = target(method, dtype, kappa, p)
    with_eps = method == "chebyshev"
    a, eps = table_problem(kappa, 48, with_eps=with_eps, seed=int(kappa) % 97 + p)
    if backend.backend == "jax":  # one compile for every κ, not one each
        a, eps = one_ridge_for_every_kappa(a, eps)
    x = backend.asarray(a, dtype)
    res = matroot.inv_root_info(x, p, method=method, eps=eps)
    ref = oracle_inv_root(to_numpy(x).astype(np.float64), p, eps)
    err = relative_error(to_numpy(res.root), ref)
    converged = to_numpy(res.converged)
    if tol is None:
        assert np.all(np.isfinite(to_numpy(res.root)))
        assert np.all(~converged | (err < 0.5))
        return
    if method == "chebyshev" and kappa > 1e2:
        # Degree cap permitting: where the fit met tol the error must meet it too.
        assert np.all(err[converged] <= tol), (err, converged)
        assert np.all(converged | (to_numpy(res.residual) > matroot.default_tol(
            "chebyshev", dtype)))
        return
    assert np.all(converged), (to_numpy(res.residual), to_numpy(res.iterations))
    assert np.all(err <= tol), f"max error {err.max():.2e} > {tol:.0e}"


@pytest.mark.parametrize("with_eps", [False, True], ids=["spd", "psd+eps"])
@pytest.mark.parametrize("method", ["evd", "newton_db", "coupled_newton"])
def test_accuracy_eps_placement(method, with_eps):
    """Both an SPD A and a rank-deficient A + ridge meet the float32 κ=1e4 target."""
    a, eps = table_problem(1e4, 40, with_eps=with_eps, seed=5)
    x = a.astype(np.float32)
    root = matroot.inv_root(x, 4, method=method, eps=eps)
    err = relative_error(root, oracle_inv_root(x, 4, eps))
    assert err.max() <= target(method, "float32", 1e4, 4)


@pytest.mark.parametrize("n", [1, 2, 7, 200])
@pytest.mark.parametrize("method", list(SOLVERS))
def test_accuracy_over_sizes(method, n):
    a, eps = table_problem(1e2, n, with_eps=method == "chebyshev", seed=n)
    x = a.astype(np.float32)
    root = matroot.inv_root(x, 2, method=method, eps=eps)
    err = relative_error(root, oracle_inv_root(x, 2, eps))
    assert err.max() <= target(method, "float32", 1e2, 2)


@pytest.mark.slow
@pytest.mark.parametrize("method,p", [("evd", 4), ("newton_db", 4), ("coupled_newton", 4),
                                      ("minimax", 4), ("newton_db", 2)])
def test_accuracy_n1024(method, p):
    rng = np.random.default_rng(1024)
    a, _, _ = spd_stack(rng, (1,), 1024, 1e4, lam_max=3.0)
    x = a.astype(np.float32)
    res = matroot.inv_root_info(x, p, method=method)
    err = relative_error(res.root, oracle_inv_root(x, p))
    assert bool(np.all(res.converged))
    assert err.max() <= target(method, "float32", 1e4, p)
