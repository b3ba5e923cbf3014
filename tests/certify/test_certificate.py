"""Issue 21, part 1: one regression test per way a wrong root was reported converged.

Errors are measured against the float64 eigh oracle of the values passed; the
tolerance is the README table's entry (:func:`matroot.solvers.registry.accuracy_target`) for
the matrix's κ, or the looser ``tol`` the call asked for.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import matroot
from matroot.testing import oracle_inv_root, random_orthogonal, relative_error
from matroot.certify.verify import sandwich_bound
from matroot.solvers.registry import accuracy_target

ITERATIVE = ("newton_db", "coupled_newton", "minimax")


def _compose(lam, seed=0):
    q = random_orthogonal(np.random.default_rng(seed), (), lam.shape[-1])
    a = (q * lam) @ q.T
    return (a + a.T) / 2


def _converged_means_right(res, a, p, *, kappa, method, precision, tol=0.0, eps=0.0):
    """Every matrix reported converged is within max(table, tol) of the oracle."""
    root = np.asarray(res.root, dtype=np.float64)
    err = np.atleast_1d(relative_error(root, oracle_inv_root(
        np.asarray(a, dtype=np.float64), p, eps)))
    target = np.maximum(accuracy_target(method, precision, p, np.full(err.shape, kappa)), tol)
    converged = np.atleast_1d(np.asarray(res.converged))
    assert np.all(err[converged] <= target[converged]), (err, target, converged)
    return err, converged


# --- the returned root is what is judged -----------------------------------------------------

@pytest.mark.parametrize("method", ["evd", *ITERATIVE])
@pytest.mark.parametrize("dtype,tiny", [("float32", 1e-39), ("float64", 1e-310)])
def test_a_root_that_overflows_unscaled_is_not_converged(method, dtype, tiny):
    """p = 1 of a matrix whose eigenvalues are all subnormal: the scaled root is fine,
    the returned one is infinite."""
    a = (np.diag([1.0, 0.5, 0.25]) * tiny).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            res = matroot.inv_root_info(a, 1, method=method)
    assert not bool(res.converged) and not np.all(np.isfinite(res.root))
    with pytest.warns(matroot.ConvergenceWarning, match="overflow"), \
            np.errstate(all="ignore"):
        matroot.inv_root(a, 1, method=method)


@pytest.mark.parametrize("method", ["evd", *ITERATIVE])
@pytest.mark.parametrize("dtype,tiny", [("float32", 2.0 ** -140), ("float64", 2.0 ** -1060)])
@pytest.mark.parametrize("p", [2, 4])
def test_subnormal_input_is_not_rounded_away(method, dtype, tiny, p):
    """Every entry subnormal: symmetrising before scaling used to round it away. (The
    entries keep only a few bits, so κ is that of the values passed.)"""
    lam = np.geomspace(1.0, 0.1, 6)
    a = (_compose(lam, seed=3) * tiny).astype(dtype)
    passed = np.linalg.eigvalsh(a.astype(np.float64) / tiny)
    kappa = passed.max() / passed.min()
    res = matroot.inv_root_info(a, p, method=method)
    # The oracle of a / tiny (an exact scaling), scaled back: the oracle's own
    # eigenvalues would be subnormal, with as few bits as the entries.
    ref = oracle_inv_root(a.astype(np.float64) / tiny, p) * tiny ** (-1.0 / p)
    err = relative_error(np.asarray(res.root, dtype=np.float64), ref)
    assert bool(res.converged)
    assert err <= accuracy_target(method, dtype, p, np.array([kappa]))[0]


@pytest.mark.parametrize("dtype,scale", [("float32", 2.0 ** -130), ("float32", 2.0 ** -140),
                                         ("float64", 1e-50), ("float64", 1e50)])
@pytest.mark.parametrize("options", [dict(method="minimax", rtol=5e-3),
                                     dict(method="minimax", rtol=5e-3, steps="fixed"),
                                     dict(method="coupled_newton", rtol=5e-3, steps="fixed")],
                         ids=["adaptive", "fixed-minimax", "fixed-coupled"])
def test_extreme_scales_on_torch_with_rtol(dtype, scale, options):
    """torch divides a number by a tensor as number·(1/tensor), so the ridge of a
    subnormal-scale stack was 0·inf = NaN (adaptive minimax crashed); the fixed path's
    power-of-two inverse was made in float32 (1e±50 in float64 overflowed) and is
    beyond float32 for subnormal entries (it raised "contains NaN or Inf"): now that
    call is solved on the adaptive path. Every matrix right and converged."""
    torch = pytest.importorskip("torch")
    lam = np.geomspace(1.0, 1e-2, 8)
    a = np.stack([_compose(lam, seed=s) for s in (4, 5)]) * scale
    a = a.astype(dtype)
    exact = a.astype(np.float64) / scale
    for p in (2, 4):
        res = matroot.inv_root_info(torch.from_numpy(a), p, **options)
        ref = oracle_inv_root(exact, p) * scale ** (-1.0 / p)
        err = relative_error(res.root.double().numpy(), ref)
        assert bool(res.converged.all()) and np.all(err <= 5e-3), (p, err)


def test_the_device_verdict_leaves_a_matrix_beyond_the_fixed_range_alone():
    """The device verdict reads nothing: a float32 matrix of subnormal entries next to
    a normal one comes back NaN and not converged, and its neighbour is untouched."""
    torch = pytest.importorskip("torch")
    good = _compose(np.geomspace(1.0, 1e-2, 8), seed=6)
    a = torch.from_numpy(np.stack([good, good * 2.0 ** -140]).astype(np.float32))
    options = dict(method="minimax", rtol=5e-3, steps="fixed", verdict="device")
    res = matroot.inv_root_info(a, 2, **options)
    alone = matroot.inv_root_info(a[:1], 2, **options)
    assert res.converged.tolist() == [True, False] and bool(res.root[1].isnan().all())
    assert torch.equal(res.root[0], alone.root[0])


# --- the stall rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["newton_db", "coupled_newton"])
@pytest.mark.parametrize("p", [4, 8])
def test_one_small_direction_is_not_a_stall(method, p):
    """One eigenvalue far below a bulk and a tol near 1/n: the one direction still
    converging used to look like the rounding floor (normalised residual ~1/√n)."""
    n = 64
    lam = np.concatenate([[1e-5], np.linspace(0.5, 1.0, n - 1)])
    a = _compose(lam, seed=1).astype(np.float32)
    tol = 1.0 / n
    res = matroot.inv_root_info(a, p, method=method, tol=tol)
    _converged_means_right(res, a, p, kappa=1e5, method=method, precision="float32", tol=tol)


# --- the error estimate sees every direction ---------------------------------------------

@pytest.mark.parametrize("method", ITERATIVE)
@pytest.mark.parametrize("steps", [1, 2, 3])
def test_few_fixed_steps_are_caught(method, steps):
    """tol=0 and a few steps leave a root far too small in its small-eigenvalue
    directions; the first-order estimate (scaled by ‖X‖) did not see it."""
    a = _compose(np.geomspace(1e-4, 1.0, 32), seed=2)
    res = matroot.inv_root_info(a, 2, method=method, tol=0, max_iter=steps)
    err, converged = _converged_means_right(res, a, 2, kappa=1e4, method=method,
                                            precision="float64")
    assert not converged.any() or err.max() <= 1e-7


@pytest.mark.parametrize("p", [48, 64, 128])
def test_large_p_coupled_newton(p):
    """An O(1) residual is not divided by p: converged roots meet the table at p ≫ 1."""
    a = _compose(np.geomspace(1.0 / 3e4, 1.0, 48), seed=4).astype(np.float32)
    res = matroot.inv_root_info(a, p, method="coupled_newton")
    _converged_means_right(res, a, p, kappa=3e4, method="coupled_newton",
                           precision="float32")


def test_sandwich_bound_bounds_the_error_in_every_direction():
    """The per-direction bound holds for a commuting error in the worst direction."""
    rng = np.random.default_rng(0)
    for p in (1, 2, 4, 64):
        lam = np.geomspace(1e-3, 1.0, 8)
        factors = 1 + rng.uniform(-0.3, 0.3, 8)
        x_true = lam ** (-1 / p)
        x = x_true * factors
        rho = np.abs(x ** p * lam - 1).max()
        err = np.linalg.norm(x - x_true) / np.linalg.norm(x_true)
        assert err <= float(sandwich_bound(np.array([rho]), p)[0]) * (1 + 1e-12)


# --- eps, dtypes, odd inputs ----------------------------------------------------------------

def test_eps_is_added_in_the_dtype_of_evd_float64_eigh():
    """A float32 matrix plus eps at κ ≈ 1e6: the float64 retry sees A + eps·I formed in
    float64, not rounded to float32 first."""
    lam = np.concatenate([np.zeros(8), np.geomspace(1e-2, 1.0, 24)])
    a = _compose(lam, seed=5).astype(np.float32)
    eps = 1.0 / 3e6 + 1e-13  # not representable next to λmax in float32
    res = matroot.inv_root_info(a, 2, method="evd", eps=eps)
    kappa = (1.0 + eps) / eps
    _converged_means_right(res, a, 2, kappa=kappa, method="evd", precision="float32",
                           eps=eps)
    assert bool(res.converged)


def test_longdouble_input_is_a_clear_error():
    if np.longdouble == np.float64:
        pytest.skip("long double is float64 on this platform")
    with pytest.raises(TypeError, match="float64"):
        matroot.inv_root(np.eye(3, dtype=np.longdouble), 2)


def test_evd_float32_overflow_warns_of_overflow():
    a = np.diag([1.0, 1e-3]).astype(np.float32)
    with pytest.warns(matroot.ConvergenceWarning, match="overflow"), \
            np.errstate(all="ignore"):
        res = matroot.inv_root_info(a, 0.05, method="evd")
    assert not bool(res.converged)


def test_eps_beyond_the_dtype_range_is_a_value_error():
    with pytest.raises(ValueError, match="eps"):
        matroot.inv_root(np.eye(3, dtype=np.float32), 2, eps=1e39)


def test_repr_of_an_empty_batch():
    res = matroot.inv_root_info(np.zeros((0, 4, 4)), 2)
    assert "converged 0/0" in repr(res)


def test_np_matrix_is_a_clear_error():
    with pytest.raises(TypeError, match="asarray"):
        matroot.inv_root(np.asmatrix(np.eye(3)), 2)


def test_fixed_steps_far_off_warn_and_fallback_repairs_them():
    a = _compose(np.geomspace(1e-4, 1.0, 16), seed=6)[None]
    with pytest.warns(matroot.ConvergenceWarning):
        matroot.inv_root(a, 2, method="newton_db", tol=0, max_iter=2)
    fixed = matroot.inv_root_info(a, 2, method="newton_db", tol=0, max_iter=2, fallback="evd")
    assert bool(fixed.repaired[0]) and bool(fixed.converged[0])
    assert relative_error(fixed.root, oracle_inv_root(a, 2)).max() <= 1e-7


# --- caller-supplied spectral bounds ---------------------------------------------------------

def _gram(seed=0, n=32):
    g = np.random.default_rng(seed).standard_normal((3, n, n))
    return g @ np.swapaxes(g, -1, -2) / n + 0.01 * np.eye(n)


@pytest.mark.parametrize("method", ["newton_db", "coupled_newton", "minimax", "chebyshev"])
def test_supplied_bounds_skip_the_certification(method):
    # n = 96: the 64-step Lanczos run no longer spans the space, and the check's
    # κ from the bounds and the root (40 matrix-vector products) costs less.
    a = _gram(n=96)
    lam = np.linalg.eigvalsh(a)
    res = matroot.inv_root_info(a, 4, method=method, lambda_max_upper=lam[:, -1] * 1.01,
                                lambda_min_lower=lam[:, 0] * 0.99)
    computed = matroot.inv_root_info(a, 4, method=method)
    assert res.converged.all()
    assert np.all(res.check_matmuls < computed.check_matmuls)
    kappa = lam[:, -1] / lam[:, 0]
    err = relative_error(res.root, oracle_inv_root(a, 4))
    assert np.all(err <= accuracy_target(method, "float64", 4, kappa))


@pytest.mark.parametrize("method", ["newton_db", "coupled_newton", "minimax", "chebyshev"])
@pytest.mark.parametrize("wrong", ["lambda_max_upper", "lambda_min_lower"])
def test_wrong_supplied_bounds_are_caught(method, wrong):
    """A λmax bound far too small, or a λmin bound far too high: never a wrong root
    reported converged."""
    a = _gram(seed=1)
    lam = np.linalg.eigvalsh(a)
    value = lam[:, -1] * 0.3 if wrong == "lambda_max_upper" else lam[:, 0] * 50
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            res = matroot.inv_root_info(a, 4, method=method, **{wrong: value})
    kappa = lam[:, -1] / lam[:, 0]
    _converged_means_right(res, a, 4, kappa=float(kappa.max()), method=method,
                           precision="float64")


def _no_lanczos(*_, **__):
    raise AssertionError("a Lanczos run was made although the caller gave the bounds")


@pytest.mark.parametrize("method", ["newton_db", "coupled_newton", "minimax", "chebyshev"])
@pytest.mark.parametrize("given", ["both", "upper_and_eps"])
def test_supplied_bounds_cost_no_lanczos_run(method, given, monkeypatch):
    """λmax and λmin given (or λmax and a ridge, for a method that takes the ridge as
    its λmin): no Lanczos run at all; κ for the check comes from the bounds and the
    root, and the roots reported converged meet the table at their true κ."""
    import matroot.roots.stack_solve
    import matroot.certify.verify

    if given == "upper_and_eps" and method == "chebyshev":
        pytest.skip("chebyshev estimates λmin from the spectrum unless it is given")
    eps = 1e-3
    a = _gram(seed=3, n=96)
    lam = np.linalg.eigvalsh(a) + eps
    bounds = dict(lambda_max_upper=lam[:, -1] * 1.01)
    if given == "both":
        bounds["lambda_min_lower"] = lam[:, 0] * 0.99
    for module in (matroot.roots.stack_solve, matroot.certify.verify):
        monkeypatch.setattr(module, "ritz_values", _no_lanczos)
    for dtype in (np.float32, np.float64):
        res = matroot.inv_root_info(a.astype(dtype), 4, method=method, eps=eps, **bounds)
        assert res.converged.all(), (method, dtype)
        _converged_means_right(res, a, 4, kappa=float((lam[:, -1] / lam[:, 0]).min()),
                               method=method, precision=np.dtype(dtype).name, eps=eps)


@pytest.mark.parametrize("method", ["newton_db", "coupled_newton", "minimax", "chebyshev"])
@pytest.mark.parametrize("shortfall", [0.3, 0.7, 0.95])
@pytest.mark.parametrize("p", [2, 4])
def test_too_small_supplied_lambda_max_without_lanczos(method, shortfall, p):
    """A λmax bound below λmax with the λmin bound given (no Lanczos run): the
    scaled spectrum reaches past 1, and whatever comes out is judged by the check
    of the root; float32, where the iterations leave their basin soonest."""
    a = _gram(seed=4, n=64)
    lam = np.linalg.eigvalsh(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            res = matroot.inv_root_info(a.astype(np.float32), p, method=method,
                                        lambda_max_upper=lam[:, -1] * shortfall,
                                        lambda_min_lower=lam[:, 0] * 0.99)
    _converged_means_right(res, a, p, kappa=float((lam[:, -1] / lam[:, 0]).min()),
                           method=method, precision="float32")


def test_kappa_from_the_root_is_a_lower_estimate():
    """κ from a root and the caller's bound: at most (1 + ρ)·κ for an accurate root
    (a stricter bucket, never a looser one), never above the caller's bound."""
    from matroot.certify.verify import kappa_from_root

    for kappa in (1e2, 1e4):
        lam = np.geomspace(1 / kappa, 1.0, 80)
        a = _compose(lam, seed=5)[None]
        root = oracle_inv_root(a, 2)
        estimate, cost = kappa_from_root(a, root, 2, np.array([np.inf]))
        assert kappa / 3 <= float(estimate[0]) <= kappa * (1 + 1e-6)
        capped, _ = kappa_from_root(a, root, 2, np.array([kappa / 10]))
        assert float(capped[0]) == kappa / 10
        assert cost < 1


def test_supplied_bounds_are_validated():
    a = np.eye(3)[None]
    with pytest.raises(ValueError, match="lambda_max_upper"):
        matroot.inv_root(a, 2, method="newton_db", lambda_max_upper=-1.0)
    with pytest.raises(ValueError, match="batch shape"):
        matroot.inv_root(a, 2, method="newton_db", lambda_max_upper=np.ones(4))


def _gram_stack(seed: int, b: int = 2, n: int = 5, ridge: float = 0.1) -> np.ndarray:
    g = np.random.default_rng(seed).standard_normal((b, n, n + 2))
    return g @ np.swapaxes(g, -1, -2) + ridge * np.eye(n)


@pytest.mark.parametrize("kwargs, match", [
    (dict(single=True), "add a leading axis"),
    (dict(certificate="probabilistic"), "certificate='probabilistic' is not one of"),
    (dict(other_n=True), "of one shape"),
])
def test_verify_root_names_bad_arguments(kwargs, match):
    """matroot.certify.verify.verify_root called directly: a single n×n matrix was read as a
    stack of n rows (n "error estimates" for one matrix, silently), an unknown
    certificate ran the deterministic one without a word, and roots of another size
    died in NumPy's matmul ("mismatch in its core dimension")."""
    from matroot.certify.verify import verify_root

    a = _gram_stack(0)
    root = oracle_inv_root(a, 2)
    if kwargs.get("single"):
        a, root = a[0], root[0]
    if kwargs.get("other_n"):
        root = root[:, :4, :4]
    with pytest.raises(ValueError, match=match):
        verify_root(a, root, 2, unit_roundoff=2.0 ** -53,
                    certificate=kwargs.get("certificate", "deterministic"))

