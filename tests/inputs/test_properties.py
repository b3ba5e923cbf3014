"""Property tests: identities every inverse p-th root must satisfy, on random SPD stacks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import matroot
from matroot.solvers.registry import SOLVERS, solvers_supporting
from matroot.testing import (
    FAMILIES,
    accuracy_tolerance,
    random_orthogonal,
    relative_error,
    spd_stacks,
)

from conftest import to_numpy

ITERATIVE = ("newton_db", "coupled_newton")
#: Every registered solver goes through the property suite.
ALL_METHODS = tuple(SOLVERS)
#: float64 tolerances for κ ≤ 1e4 (chebyshev is run with a ridge that bounds κ by 1e3).
TOL64 = {"evd": 1e-9, "newton_db": 1e-7, "coupled_newton": 1e-7, "minimax": 1e-7,
         "chebyshev": 1e-6}


def stacks(max_kappa=1e4, **kw):
    """SPD stacks of every family at moderate scale (these tests rescale by up to 1e±6)."""
    families = [f for f in FAMILIES if f != "scale_extremes"]
    return spd_stacks(n=(1, 16), kappa=(1.0, max_kappa), families=families, eps=0.0, **kw)


def _methods_for(p):
    return [m for m in ALL_METHODS if m in solvers_supporting(p)]


def _call(case_a, p, method, **kw):
    if method == "chebyshev":
        # A ridge bounds κ by 1e3, the range Chebyshev is for; its fit then meets 1e-6.
        kw.setdefault("eps", 1e-3 * float(np.max(np.abs(case_a))) + 1e-300)
        kw.setdefault("tol", 1e-6)
    return matroot.inv_root(case_a, p, method=method, **kw), kw.get("eps", 0.0)


@given(case=stacks(), p=st.sampled_from([1, 2, 3, 4, 8]), data=st.data())
def test_matches_oracle_float64(case, p, data):
    method = data.draw(st.sampled_from(_methods_for(p)))
    root, eps = _call(case.a, p, method)
    assert root.shape == case.a.shape and root.dtype == np.float64
    err = relative_error(root, case.inv_root(p, eps))
    assert err.max() <= TOL64[method]


@given(case=stacks(1e3), p=st.sampled_from([1, 2, 3, 4]), data=st.data())
def test_root_power_times_a_is_identity(case, p, data):
    method = data.draw(st.sampled_from(_methods_for(p)))
    root, eps = _call(case.a, p, method)
    n = case.a.shape[-1]
    reg = case.a + eps * np.eye(n)
    product = np.linalg.matrix_power(root, p) @ reg
    dev = np.linalg.norm(product - np.eye(n), axis=(-2, -1)) / np.sqrt(n)
    assert dev.max() <= 1e3 * TOL64[method]


@given(case=stacks(), data=st.data())
def test_root_is_symmetric(case, data):
    method = data.draw(st.sampled_from(ALL_METHODS))
    root, _ = _call(case.a.astype(np.float32), 4, method)
    asym = np.linalg.norm(root - np.swapaxes(root, -1, -2), axis=(-2, -1))
    # Asymmetry is an error like any other: held to the float32 accuracy target (an
    # accurate newton_db root of a clustered 3×3 at κ = 4e3 is 2e-5 off symmetric).
    tol = accuracy_tolerance("float32", float(np.max(case.kappa)), 4, method=method)
    assert np.all(asym <= tol * np.linalg.norm(root, axis=(-2, -1)))


@given(case=stacks(1e3), log_c=st.floats(-6, 6),
       p=st.sampled_from([2, 4]), data=st.data())
def test_scale_covariance(case, log_c, p, data):
    method = data.draw(st.sampled_from(_methods_for(p)))
    c = 10.0 ** log_c
    base, eps = _call(case.a, p, method)
    scaled, _ = _call(c * case.a, p, method, **({"eps": c * eps} if eps else {}))
    assert relative_error(scaled, c ** (-1.0 / p) * base).max() <= 10 * TOL64[method]


@given(case=stacks(1e3), seed=st.integers(0, 2**31 - 1), data=st.data())
def test_orthogonal_equivariance(case, seed, data):
    method = data.draw(st.sampled_from(ALL_METHODS))
    n = case.a.shape[-1]
    q = random_orthogonal(np.random.default_rng(seed), (), n)
    rotated = q @ case.a @ q.T
    base, eps = _call(case.a, 4, method)
    turned, _ = _call(rotated, 4, method, **({"eps": eps} if eps else {}))
    assert relative_error(turned, q @ base @ q.T).max() <= 10 * TOL64[method]


@given(case=stacks(batch_shape=(4,)), data=st.data())
def test_batch_independence(case, data):
    """A matrix's result does not depend on its batch neighbours (to rounding)."""
    method = data.draw(st.sampled_from(ALL_METHODS))
    kw = {"eps": 1e-3} if method == "chebyshev" else {}
    together = matroot.inv_root(case.a, 2, method=method, **kw)
    for i in range(4):
        alone = matroot.inv_root(case.a[i], 2, method=method, **kw)
        assert relative_error(together[i], alone) <= 1e-12


@given(case=stacks(1e3), p=st.sampled_from([2, 4]))
def test_all_methods_agree(case, p):
    eps = 1e-3 * float(np.max(np.abs(case.a)))
    roots = {m: matroot.inv_root(case.a, p, method=m, eps=eps) for m in _methods_for(p)}
    ref = roots.pop("evd")
    for method, root in roots.items():
        assert relative_error(root, ref).max() <= TOL64[method], method


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_output_keeps_namespace_device_dtype(backend, method, dtype):
    rng = np.random.default_rng(0)
    g = rng.standard_normal((2, 3, 6, 6))
    a = backend.asarray(g @ np.swapaxes(g, -1, -2) + np.eye(6), dtype)
    res = matroot.inv_root_info(a, 2, method=method)
    from array_api_compat import array_namespace, device
    for field in (res.root, res.residual, res.iterations, res.converged, res.lambda_max,
                  res.matmuls):
        assert array_namespace(field) is array_namespace(a)
        assert device(field) == device(a)
    assert res.root.dtype == a.dtype and tuple(res.root.shape) == (2, 3, 6, 6)
    assert tuple(res.converged.shape) == (2, 3)
    ref = np.linalg.inv(_sqrtm(to_numpy(a).astype(np.float64)))
    assert relative_error(to_numpy(res.root), ref).max() < (1e-4 if dtype == "float32"
                                                            else 1e-8)


def _sqrtm(a):
    lam, q = np.linalg.eigh(a)
    return (q * np.sqrt(lam)[..., None, :]) @ np.swapaxes(q, -1, -2)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8, 0.5, 2.5])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_inverse_root_entries_round_the_same_at_every_position(p, dtype):
    """The powers behind the roots' unscaling and evd's eigenvalues: an entry gets
    the same bits at any offset in an array of any length (torch's SIMD ``pow``
    rounds a vector's last lanes differently, so a matrix's root would depend on
    its batch neighbours), and stays within a few ulp of the exact power."""
    torch = pytest.importorskip("torch")
    from matroot._xp import inverse_root_entries

    x = torch.rand(101, generator=torch.Generator().manual_seed(1), dtype=getattr(torch, dtype))
    x = 10.0 ** (12 * x - 6)
    whole = inverse_root_entries(x, p)
    # float64 entries at other p take float64 pow itself (nothing wider to round from).
    positions = [] if dtype == "float64" and p not in (1, 2, 4, 8) else [
        (0, 1), (0, 7), (0, 12), (5, 101), (13, 50), (17, 101), (100, 101)]
    for start, stop in positions:
        assert torch.equal(inverse_root_entries(x[start:stop].clone(), p), whole[start:stop])
    exact = x.double() ** (-1.0 / p)
    ulp = torch.finfo(x.dtype).eps
    assert float(((whole.double() - exact) / exact).abs().max()) <= 4 * ulp
