"""Bad and unusual input: clear errors, NaN isolation, singular/indefinite matrices,
asymmetry, strides, empty batches, 16-bit dtypes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from rounding import relative_distance, rounding_tolerance

import matroot
from matroot import ConvergenceWarning
from matroot.solvers import SOLVERS
from matroot.testing import oracle_inv_root, relative_error, spd_stack

from conftest import to_numpy

#: Every registered solver goes through the bad-input suite.
METHODS = tuple(SOLVERS)


def _spd(batch=(3,), n=8, kappa=1e2, seed=0):
    return spd_stack(np.random.default_rng(seed), batch, n, kappa, lam_max=2.0)[0]


@pytest.mark.parametrize("shape", [(5,), ()])
def test_too_few_dimensions(shape):
    with pytest.raises(ValueError, match=r"at least 2 dimensions.*" + str(shape).replace(
            "(", r"\(").replace(")", r"\)")):
        matroot.inv_root(np.ones(shape), 2)


def test_non_square():
    with pytest.raises(ValueError, match=r"square.*\(2, 3, 4\)"):
        matroot.inv_root(np.ones((2, 3, 4)), 2)


@pytest.mark.parametrize("dtype,word", [(np.int64, "integer"), (np.bool_, "boolean"),
                                        (np.complex128, "complex")])
def test_non_real_dtypes(dtype, word):
    with pytest.raises(TypeError, match=word):
        matroot.inv_root(np.eye(3, dtype=dtype), 2)


def test_not_an_array():
    with pytest.raises(TypeError, match="list"):
        matroot.inv_root([[1.0, 0.0], [0.0, 1.0]], 2)


@pytest.mark.parametrize("p", [0, -2, float("nan"), float("inf")])
def test_p_must_be_positive(p):
    with pytest.raises(ValueError, match="p must be"):
        matroot.inv_root(np.eye(3), p)


def test_p_type():
    with pytest.raises(TypeError, match="p must be a real number"):
        matroot.inv_root(np.eye(3), "4")


@pytest.mark.parametrize("method,p,names", [
    ("newton_db", 3, "'evd', 'coupled_newton', 'chebyshev'"),
    ("coupled_newton", 2.5, "'evd'"),
    ("chebyshev", 0.5, "'evd'"),
])
def test_unsupported_method_p_names_alternatives(method, p, names):
    with pytest.raises(ValueError, match=f"does not support p={p}; methods that do: {names}"):
        matroot.inv_root(np.eye(3), p, method=method)


def test_non_integer_p_with_evd():
    a = _spd()
    root = matroot.inv_root(a, 2.5, method="evd")
    assert relative_error(root, oracle_inv_root(a, 2.5)).max() < 1e-12


@pytest.mark.parametrize("kwargs,match", [
    ({"eps": -1e-3}, "eps must be finite and >= 0"),
    ({"eps": float("nan")}, "eps must be finite"),
    ({"method": "cholesky"}, "method='cholesky' is not one of 'auto', 'evd'"),
    ({"scaling": "trace"}, "scaling='trace' is not one of 'power', 'frobenius'"),
    ({"matmul_dtype": "float8"}, "matmul_dtype='float8' is not one of None, 'float16'"),
    ({"tol": -1.0}, "tol must be finite and >= 0"),
    ({"max_iter": 0}, "max_iter must be a positive integer"),
    ({"compute_dtype": "float16"}, "compute_dtype='float16' is not one of"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        matroot.inv_root(np.eye(3), 2, **kwargs)


def test_bfloat16_not_in_numpy():
    with pytest.raises(ValueError, match=r"bfloat16.*not available in the numpy backend"):
        matroot.inv_root(np.eye(3, dtype=np.float32), 2, method="coupled_newton",
                         matmul_dtype="bfloat16")


def test_float16_not_in_array_api_strict():
    import array_api_strict as xps
    with pytest.raises(ValueError, match=r"float16.*array_api_strict"):
        matroot.inv_root(xps.eye(3, dtype=xps.float32), 2, matmul_dtype="float16")


def test_16bit_matmuls_need_float32_compute():
    with pytest.raises(ValueError, match="float32 computation"):
        matroot.inv_root(np.eye(3), 2, method="coupled_newton", matmul_dtype="float16")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_check_finite_raises(bad):
    a = _spd()
    a[1, 2, 3] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        matroot.inv_root(a, 2)


@pytest.mark.parametrize("method", METHODS)
def test_non_finite_matrix_is_isolated(backend, method):
    """With check_finite=False the bad matrix is NaN and the others are bit-identical
    to a batch with a good matrix in its place (the same program on the same inputs),
    and equal to rounding to the batch without it (another batch size: XLA compiles
    each into its own program, and BLAS kernels may block a stack differently)."""
    a = _spd(batch=(3,), n=6)
    poisoned = a.copy()
    poisoned[1, 0, 4] = np.nan
    kw = {"eps": 1e-2} if method == "chebyshev" else {}
    with pytest.warns(ConvergenceWarning):
        bad = matroot.inv_root(backend.asarray(poisoned), 4, method=method,
                               check_finite=False, **kw)
    info = matroot.inv_root_info(backend.asarray(poisoned), 4, method=method,
                                 check_finite=False, **kw)
    replaced = a.copy()
    replaced[1] = _spd(batch=(1,), n=6, kappa=1e3, seed=4)[0]
    same_size = to_numpy(matroot.inv_root(backend.asarray(replaced), 4, method=method, **kw))
    bad = to_numpy(bad)
    assert np.all(np.isnan(bad[1]))
    assert to_numpy(info.converged).tolist() == [True, False, True]
    np.testing.assert_array_equal(bad[[0, 2]], same_size[[0, 2]])
    clean = to_numpy(matroot.inv_root(backend.asarray(a[[0, 2]]), 4, method=method, **kw))
    assert np.all(relative_distance(bad[[0, 2]], clean)
                  <= rounding_tolerance(a.dtype, 1e3, a.shape[-1]))


@pytest.mark.parametrize("method", METHODS)
def test_all_zero_matrix_with_no_ridge_is_nan(method):
    a = np.zeros((2, 4, 4))
    a[0] = np.eye(4) * 3.0
    info = matroot.inv_root_info(a, 2, method=method)
    assert info.converged.tolist() == [True, False]
    assert np.all(np.isnan(info.root[1]))
    np.testing.assert_allclose(info.root[0], np.eye(4) / np.sqrt(3.0), rtol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_all_zero_matrix_with_ridge(method):
    """Zero gradients at step 1: (0 + eps·I)^(-1/p) = eps^(-1/p)·I, no 0/0."""
    root = matroot.inv_root(np.zeros((3, 5, 5), dtype=np.float32), 4, method=method,
                            eps=1e-4)
    np.testing.assert_allclose(root, np.broadcast_to(np.eye(5) * 10.0, (3, 5, 5)),
                               rtol=1e-3)


def _singular(n=8, seed=3):
    g = np.random.default_rng(seed).standard_normal((n, n // 2))
    return g @ g.T


def _indefinite(n=8, seed=4):
    q = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))[0]
    lam = np.linspace(1.0, 2.0, n)
    lam[0] = -0.5
    return (q * lam) @ q.T


@pytest.mark.parametrize("make", [_singular, _indefinite], ids=["singular", "indefinite"])
@pytest.mark.parametrize("method", METHODS)
def test_no_silent_answer_for_singular_or_indefinite(method, make):
    """Never a finite answer reported as converged; inv_root warns."""
    a = np.stack([np.eye(8) * 2.0, make()])
    info = matroot.inv_root_info(a, 2, method=method)
    assert info.converged.tolist() == [True, False]
    if method == "evd":
        assert np.all(np.isnan(info.root[1]))
    with pytest.warns(ConvergenceWarning, match="1 of 2 matrices"):
        matroot.inv_root(a, 2, method=method)


def test_rounding_asymmetry_does_not_matter():
    a = _spd(n=10)
    noise = 1e-15 * np.random.default_rng(1).standard_normal(a.shape)
    for method in METHODS:
        kw = {"eps": 1e-2} if method == "chebyshev" else {}
        r1 = matroot.inv_root(a, 4, method=method, **kw)
        r2 = matroot.inv_root(a + noise, 4, method=method, **kw)
        assert relative_error(r2, r1).max() < 1e-12, method


def test_asymmetric_input_uses_symmetric_part():
    a = _spd(n=6)
    skew = np.random.default_rng(2).standard_normal(a.shape)
    skew = skew - np.swapaxes(skew, -1, -2)
    root = matroot.inv_root(a + 0.1 * skew, 2, method="newton_db")
    assert relative_error(root, oracle_inv_root(a, 2)).max() < 1e-8


@pytest.mark.parametrize("method", METHODS)
def test_strided_and_transposed_inputs(method):
    big = _spd(batch=(6,), n=7)
    kw = {"eps": 1e-2} if method == "chebyshev" else {}
    contiguous = matroot.inv_root(np.ascontiguousarray(big[::2]), 2, method=method, **kw)
    strided = matroot.inv_root(big[::2], 2, method=method, **kw)
    transposed = matroot.inv_root(np.swapaxes(big, -1, -2)[::2], 2, method=method, **kw)
    fortran = matroot.inv_root(np.asfortranarray(big[::2]), 2, method=method, **kw)
    for other in (strided, transposed, fortran):
        assert relative_error(other, contiguous).max() < 1e-13


def test_strided_torch_input():
    torch = pytest.importorskip("torch")
    big = torch.from_numpy(_spd(batch=(4,), n=9))
    view = big.transpose(-1, -2)[1::2]
    assert not view.is_contiguous()
    root = matroot.inv_root(view, 4, method="newton_db")
    ref = matroot.inv_root(view.contiguous(), 4, method="newton_db")
    assert relative_error(root.numpy(), ref.numpy()).max() < 1e-13


@pytest.mark.parametrize("shape", [(0, 4, 4), (2, 0, 3, 3), (3, 0, 0)])
def test_empty_batches(backend, shape):
    a = backend.asarray(np.zeros(shape))
    res = matroot.inv_root_info(a, 2)
    assert tuple(res.root.shape) == shape
    assert tuple(res.converged.shape) == shape[:-2]


def test_single_matrix_has_scalar_diagnostics():
    res = matroot.inv_root_info(np.eye(3) * 4.0, 2, method="newton_db")
    assert res.converged.shape == () and bool(res.converged)
    np.testing.assert_allclose(res.root, np.eye(3) / 2, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("method", METHODS)
def test_16bit_inputs_computed_in_float32(method, dtype):
    torch = pytest.importorskip("torch")
    a = _spd(n=8, kappa=10.0)
    x = torch.from_numpy(a).to(getattr(torch, dtype))
    kw = {"eps": 1e-2} if method == "chebyshev" else {}
    root = matroot.inv_root(x, 2, method=method, **kw)
    assert root.dtype == x.dtype
    ref = oracle_inv_root(x.to(torch.float64).numpy(), 2, kw.get("eps", 0.0))
    unit = 1e-3 if dtype == "float16" else 8e-3
    assert relative_error(root.to(torch.float64).numpy(), ref).max() < 2 * unit


def test_float16_numpy_input():
    a = _spd(n=5, kappa=10.0).astype(np.float16)
    root = matroot.inv_root(a, 2, method="newton_db")
    assert root.dtype == np.float16
    assert relative_error(root, oracle_inv_root(a.astype(np.float64), 2)).max() < 2e-3


@pytest.mark.parametrize("matmul_dtype,tol", [("float16", 3e-3), ("bfloat16", 2e-2)])
def test_16bit_matmuls_torch(matmul_dtype, tol):
    torch = pytest.importorskip("torch")
    a = _spd(n=32, kappa=1e2).astype(np.float32)
    info = matroot.inv_root_info(torch.from_numpy(a), 4, method="coupled_newton",
                                 matmul_dtype=matmul_dtype, tol=1e-3)
    assert info.root.dtype == torch.float32
    assert relative_error(info.root.numpy(), oracle_inv_root(a, 4)).max() < tol


def test_16bit_matmuls_numpy_float16():
    a = _spd(n=16, kappa=1e2).astype(np.float32)
    root = matroot.inv_root(a, 2, method="coupled_newton", matmul_dtype="float16",
                            tol=1e-3)
    assert root.dtype == np.float32
    assert relative_error(root, oracle_inv_root(a, 2)).max() < 3e-3


@pytest.mark.parametrize("method", ["newton_db", "coupled_newton"])
def test_fixed_steps_with_tol_zero(method):
    """tol=0, max_iter=k: exactly k steps for every matrix (DASH's fixed schedule), and
    the roots are judged like any other: too few steps are converged=False with a
    ConvergenceWarning (issue 21: nothing silent), enough steps converge."""
    a = _spd(batch=(3,), n=8, kappa=1e3)
    short = matroot.inv_root_info(a, 2, method=method, tol=0, max_iter=2)
    assert short.iterations.tolist() == [2, 2, 2]
    assert not short.converged.any()
    with pytest.warns(matroot.ConvergenceWarning):
        matroot.inv_root(a, 2, method=method, tol=0, max_iter=2)
    long = matroot.inv_root_info(a, 2, method=method, tol=0, max_iter=30)
    assert long.iterations.tolist() == [30, 30, 30] and long.converged.all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        matroot.inv_root(a, 2, method=method, tol=0, max_iter=30)


@pytest.mark.parametrize("method", ["newton_db", "coupled_newton"])
def test_converged_matrices_are_frozen(method):
    """An easy matrix stops early and is not degraded by its hard neighbour's steps:
    bit-identical to the same call (same batch size, same program) with an easy
    neighbour that stops with it."""
    easy = _spd(batch=(1,), n=12, kappa=2.0, seed=1)
    hard = _spd(batch=(1,), n=12, kappa=1e6, seed=2)
    both = matroot.inv_root_info(np.concatenate([easy, hard]), 2, method=method)
    twins = matroot.inv_root_info(np.concatenate([easy, easy]), 2, method=method)
    assert both.iterations[0] < both.iterations[1]
    assert both.iterations[0] == twins.iterations[0]
    np.testing.assert_array_equal(both.root[0], twins.root[0])


def test_max_iter_cap_reports_not_converged():
    a = _spd(batch=(2,), n=8, kappa=1e4)
    info = matroot.inv_root_info(a, 2, method="newton_db", max_iter=3)
    assert info.iterations.tolist() == [3, 3]
    assert not info.converged.any()
    assert np.all(info.residual > matroot.default_tol("newton_db", "float64"))


def test_large_entries_do_not_overflow_float32():
    a = (_spd(n=6) * 1e19).astype(np.float32)
    for method in ("evd", "newton_db", "coupled_newton"):
        root = matroot.inv_root(a, 2, method=method)
        assert np.all(np.isfinite(root))
        assert relative_error(root, oracle_inv_root(a, 2)).max() < 1e-4, method


def test_power_iteration_reproducible_and_global_rng_untouched():
    state = np.random.get_state()
    a = _spd(batch=(4,), n=20)
    first = matroot.power_iteration(a)
    second = matroot.power_iteration(a)
    np.testing.assert_array_equal(first, second)
    after = np.random.get_state()
    assert state[0] == after[0] and np.array_equal(state[1], after[1])
    true = np.linalg.eigvalsh(a)[..., -1]
    assert np.all(first <= true * (1 + 1e-12)) and np.all(first > 0.9 * true)


def test_torch_fused_product_matches_generic():
    """The torch baddbmm seam equals the generic expression."""
    torch = pytest.importorskip("torch")
    from matroot import _xp
    rng = np.random.default_rng(9)
    a = torch.from_numpy(rng.standard_normal((3, 5, 5)))
    b = torch.from_numpy(rng.standard_normal((3, 5, 5)))
    eye = torch.eye(5, dtype=torch.float64)
    fused = _xp.shifted_product(1.5, -0.5, a, b, eye)
    generic = 1.5 * eye - 0.5 * (a @ b)
    torch.testing.assert_close(fused, generic, rtol=1e-14, atol=1e-14)


def test_chebyshev_lower_bound_that_misses_eigenvalues_is_not_converged():
    """Eigenvalues below the fitted interval are caught by the a-posteriori check."""
    from matroot import _xp
    from matroot.solvers import SOLVERS
    from matroot.certify.verify import verify_root
    a = spd_stack(np.random.default_rng(7), (2,), 16, 1e3, lam_max=1.0)[0]
    out = SOLVERS["chebyshev"].solve(a, 2, lower=np.array([1e-1, 1e-3 / 2]), tol=1e-6,
                               max_iter=400, matmul=_xp.Matmul(np))
    check = verify_root(a, out.root, 2, unit_roundoff=2.0**-53)
    assert check.error_estimate[0] > 1e-2 and check.residual[0] > 1e-2
    assert check.error_estimate[1] < 1e-5
    assert relative_error(out.root[1], oracle_inv_root(a[1], 2)) < 1e-5


@pytest.mark.parametrize("method", METHODS)
def test_input_is_validated_once(method, monkeypatch):
    """The public edge checks ``a``; the internals (spectral bounds, solvers) trust it."""
    import matroot._checks as checks

    calls = []
    original = checks.check_stack

    def counting(a, name="a"):
        calls.append(name)
        return original(a, name)

    for module in ("matroot.roots.api", "matroot.spectrum.scaling"):
        monkeypatch.setattr(f"{module}.check_stack", counting)
    matroot.inv_root_info(_spd(), 4 if method != "evd" else 2.5, method=method)
    assert calls == ["a"]


@pytest.mark.parametrize("method", ["evd", "newton_db", "coupled_newton", "minimax"])
def test_numpy_float_errors_stay_inside_the_solve(method):
    # A singular factor diverges by design and is reported converged=False; NumPy's
    # overflow warnings from inside the solve were noise, and under a caller's
    # np.seterr(all="raise") a FloatingPointError.
    g = np.random.default_rng(0).standard_normal((2, 32, 8))
    singular = g @ g.transpose(0, 2, 1)
    with np.errstate(all="raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        result = matroot.inv_root_info(singular, 2, method=method)
        assert "nan" in repr(matroot.inv_root_info(-np.eye(3)[None], 2, method="evd"))
        polar = matroot.polar_info(np.zeros((1, 4, 4)))
    assert not result.converged.any() and not polar.converged.any()
