"""Red team, input forms: what an adversarial user passes that nobody here wrote.

Each test names what it found before its fix: a raw error where a clear ValueError or
TypeError belongs, an input silently computed at the wrong precision, or a default
that no result could meet. The accuracy claims are checked against the float64
oracles with the tolerances of :mod:`matroot.certify.polar_accuracy`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import matroot
from matroot.certify.polar_accuracy import DEFAULT_RTOL, ERROR_SLACK
from matroot.testing import oracle_inv_root, polar_relative_error, relative_error


def _stack():
    return np.stack([np.eye(3) * 2.0, np.diag([1.0, 2.0, 4.0])]).astype(np.float32)


@pytest.mark.parametrize("method", ["newton_db", "minimax", "evd"])
@pytest.mark.parametrize("library", ["numpy", "torch", "list"])
def test_jax_eager_takes_bound_arrays_of_any_library(method, library):
    """An eager JAX call with an array of bounds (NumPy, torch, a list) raised JAX's
    raw "unhashable type" / "Error interpreting argument" TypeError: the bounds went
    into the compile key of the eager call's jax.jit. They are traced arguments now."""
    jnp = pytest.importorskip("jax.numpy")
    upper = [3.0, 5.0]
    if library == "numpy":
        upper = np.array(upper)
    elif library == "torch":
        upper = pytest.importorskip("torch").tensor(upper)
    a = _stack()
    res = matroot.inv_root_info(jnp.asarray(a), 2, method=method, lambda_max_upper=upper,
                                lambda_min_lower=upper)
    assert np.asarray(res.converged).all()
    err = relative_error(np.asarray(res.root, dtype=np.float64),
                         oracle_inv_root(a.astype(np.float64), 2))
    assert (err <= 1e-5).all()  # float32's table at κ ≤ 4


@pytest.mark.parametrize("bound", ["10", np.array(["1", "2"]), np.array([1 + 0j, 2]),
                                   np.array([True, True])])
@pytest.mark.parametrize("name", ["lambda_max_upper", "lambda_min_lower"])
def test_a_bound_that_is_not_real_numbers_is_a_type_error(bound, name):
    """A string bound was read as a number by NumPy and a complex one lost its
    imaginary part with NumPy's warning; both were used."""
    with pytest.raises(TypeError, match=name):
        matroot.inv_root_info(_stack(), 2, method="newton_db", **{name: bound})


@pytest.mark.parametrize("call", [lambda x: matroot.inv_root(x, 2),
                                  lambda x: matroot.polar(x)])
def test_masked_arrays_are_refused_with_the_fix(call):
    """A masked array's mask was ignored by some methods and broke others with NumPy's
    "operands could not be broadcast" ValueError."""
    a = np.ma.masked_array(np.eye(3), mask=np.eye(3, dtype=bool))
    with pytest.raises(TypeError, match="filled"):
        call(a)


@pytest.mark.parametrize("call", [lambda x: matroot.inv_root(x, 2),
                                  lambda x: matroot.polar(x)])
def test_meta_tensors_are_refused(call):
    """torch's meta tensors reached ``Tensor.item()`` and raised its RuntimeError."""
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="meta device"):
        call(torch.zeros(2, 3, 3, device="meta"))


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (2, 0, 3), (2, 3, 0)])
def test_polar_of_empty_matrices(shape):
    """A matrix with no rows or no columns raised ZeroDivisionError building the schedule."""
    res = matroot.polar_info(np.zeros(shape))
    assert res.root.shape == shape
    assert res.converged.shape == shape[:-2] and np.all(res.converged)


@pytest.mark.parametrize("make,match", [(lambda g: g.astype(np.longdouble), "long double"),
                                        (np.matrix, "numpy.matrix")])
def test_polar_refuses_what_inv_root_refuses(make, match):
    """polar took long double input, computed it in float32 and returned float128
    reported converged (its own input check had none of inv_root's cases)."""
    g = np.random.default_rng(0).standard_normal((5, 3))
    if match == "long double" and np.longdouble == np.float64:
        pytest.skip("long double is float64 on this platform")
    with pytest.raises(TypeError, match=match):
        matroot.polar(make(g))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_polar_of_16bit_input_converges_by_default(dtype):
    """A float16/bfloat16 input (Muon's momentum) was never converged with the default
    rtol: float32's 1e-5 is below the defect of any factor rounded to 16 bits, so
    ``polar`` warned on every call. The default is now the 16-bit dtype's rtol, and
    the factor is held to it against the float64 oracle."""
    torch = pytest.importorskip("torch")
    g = np.random.default_rng(1).standard_normal((2, 48, 32))
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    res = matroot.polar_info(torch.asarray(g).to(getattr(torch, dtype)))
    assert res.root.dtype == getattr(torch, dtype)
    assert res.converged.all()
    error = polar_relative_error(res.root.double().numpy(), u @ vt)
    # κ of a 48×32 Gaussian is ~10: the rounding term is far below rtol's.
    assert error.max() <= DEFAULT_RTOL[dtype] * ERROR_SLACK
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        matroot.polar(torch.asarray(g).to(getattr(torch, dtype)))


@pytest.mark.parametrize("method", ["newton_db", "minimax", "coupled_newton", "evd",
                                    "chebyshev"])
@pytest.mark.parametrize("dtype,largest", [("float32", 3.4e38), ("float64", 1.7e308)])
@pytest.mark.parametrize("n", [1, 3])
def test_entries_near_the_largest_float(method, dtype, largest, n):
    """Entries above the largest power of two (2^127 in float32, 2^1023 in float64)
    rounded the stack's power-of-two scale up to 2^128 / 2^1024 = inf: every method
    returned NaN (converged=False) for a matrix whose root is an ordinary number. The
    oracle's scale had the same flaw."""
    rng = np.random.default_rng(3)
    q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    shape = (q * np.geomspace(1.0, 10.0, n)) @ q.T
    shape = shape / np.abs(shape).max()
    a = (shape * largest).astype(dtype)
    res = matroot.inv_root_info(a, 2, method=method)
    assert bool(res.converged)
    exact = oracle_inv_root(shape, 2) / np.sqrt(largest)
    assert np.allclose(oracle_inv_root(a, 2), exact, rtol=1e-6, atol=0)
    err = relative_error(np.asarray(res.root, dtype=np.float64), exact)
    assert err <= (1e-4 if dtype == "float32" else 1e-8)  # the table's target at κ ≤ 10


@pytest.mark.parametrize("eps", [np.full(2, 1e-3), np.array(1e-3)])
def test_an_array_eps_names_the_fix(eps):
    """An array eps was refused with "eps must be a real number, got ndarray", which
    names neither the fix (a float) nor how to have a ridge per matrix."""
    with pytest.raises(TypeError, match=r"float\(eps\).*ridge per matrix"):
        matroot.inv_root(_stack(), 2, eps=eps)


def test_accuracy_target_takes_integer_and_scalar_kappa():
    """``accuracy_target`` filled its targets in κ's dtype: an integer κ array (an
    oracle's ``np.full(b, 10)``) gave targets of 0, failing every root, and a plain
    number raised array-api-compat's TypeError."""
    from matroot.solvers.registry import accuracy_target

    as_float = accuracy_target("minimax", "float32", 2, np.array([10.0, 1e3]))
    np.testing.assert_array_equal(accuracy_target("minimax", "float32", 2, np.array([10, 1000])),
                                  as_float)
    assert float(accuracy_target("minimax", "float32", 2, 10.0)) == as_float[0]


@pytest.mark.parametrize("method", ["newton_db", "minimax", "chebyshev", "coupled_newton"])
def test_a_bad_entry_of_a_bound_array_fails_its_matrix_only(method):
    """An infinite λmax bound scaled its matrix to zero, and the NaN that came back was
    reported as a root that "overflows or loses its precision" in the output dtype.
    Now a NaN/inf/≤ 0 entry is a matrix without a scale: NaN root, converged=False,
    no overflow warning, the neighbour as without the bad entries."""
    a = np.stack([np.eye(3) * 2, np.diag([1.0, 2.0, 4.0]), np.eye(3)]).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = matroot.inv_root_info(a, 2, method=method,
                                    lambda_max_upper=np.array([np.inf, 5.0, -1.0]))
    assert np.asarray(res.converged).tolist() == [False, True, False]
    root = np.asarray(res.root)
    assert np.isnan(root[[0, 2]]).all()
    alone = matroot.inv_root_info(a[1:2], 2, method=method, lambda_max_upper=np.array([5.0]))
    np.testing.assert_allclose(root[1], np.asarray(alone.root)[0], rtol=1e-6)


@pytest.mark.compile
def test_a_numpy_bound_under_torch_compile():
    """The bound's dtype check must not run under torch.compile: Dynamo cannot trace a
    look at a NumPy array's dtype (``fullgraph=True`` failed on it)."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    g = np.random.default_rng(0).standard_normal((3, 8, 8))
    a64 = g @ g.transpose(0, 2, 1) + np.eye(8)
    upper = np.linalg.eigvalsh(a64)[:, -1] * 1.01
    a = torch.asarray(a64, dtype=torch.float32)
    options = dict(method="newton_db", tol=0.0, max_iter=4, lambda_max_upper=upper)
    compiled = torch.compile(lambda x: matroot.inv_root_info(x, 2, **options),
                             fullgraph=True, backend="eager")
    # Same program both ways but for tracing: results agree to rounding, not bitwise.
    torch.testing.assert_close(compiled(a).root, matroot.inv_root_info(a, 2, **options).root,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("call", [
    lambda m: matroot.inv_root(_stack(), 2, method="chebyshev", max_iter=m),
    lambda m: matroot.inv_root(_stack(), 2, method="minimax", max_iter=m),
    lambda m: matroot.polar(np.eye(3), method="quintic", max_iter=m)])
def test_a_huge_max_iter_is_a_value_error(call):
    """max_iter=10**12 raised NumPy's MemoryError (chebyshev's cosine matrix, minimax's
    coefficient table) and a polar schedule of 10**8 steps hung."""
    with pytest.raises(ValueError, match="max_iter"):
        call(10**12)


def test_chebyshev_degree_at_the_max_iter_limit_fits_in_memory():
    """The interpolant's coefficients took an (N, N) cosine matrix: 800 MB at N = 10,000.
    They come from one FFT now, and match the cosine sum."""
    from matroot._checks import MAX_ITER_LIMIT
    from matroot.solvers.chebyshev import chebyshev_coefficients

    degree = 40
    theta = np.pi * (np.arange(degree + 1) + 0.5) / (degree + 1)
    values = ((np.cos(theta) * 0.99 + 1.01) / 2) ** -0.5
    direct = 2.0 / (degree + 1) * np.cos(np.outer(np.arange(degree + 1), theta)) @ values
    direct[0] /= 2
    # Two float64 summations of 41 terms: rounding of a few u of the largest coefficient.
    np.testing.assert_allclose(chebyshev_coefficients(2, 0.01, degree), direct, rtol=0,
                               atol=64 * 2.0 ** -52 * np.abs(direct).max())
    assert chebyshev_coefficients(2, 0.01, MAX_ITER_LIMIT).shape == (MAX_ITER_LIMIT + 1,)


def test_the_polar_oracle_is_not_the_weak_link_at_high_kappa():
    """The float64 SVD oracle is itself off by about u·κ: at κ ≈ 5e6 it disagreed with
    the exact factor by 8e-10, above the bound a converged float64 factor is held to
    (5e-10), so a right factor read as wrong. With its long double correction it is
    within (u·κ)² of a 40-digit reference (here 2e-14 where the SVD alone is 2e-11;
    asserted 1e-12)."""
    mp = pytest.importorskip("mpmath")
    from matroot.testing import oracle_polar
    if np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
        pytest.skip("long double is float64 on this platform: no correction to test")
    rng = np.random.default_rng(5)
    u = np.linalg.qr(rng.standard_normal((40, 3)))[0]
    v = np.linalg.qr(rng.standard_normal((3, 3)))[0]
    g = (u * np.array([1.0, 2e-7, 2e-7])) @ v.T
    mp.mp.dps = 40
    big = mp.matrix(g.tolist())
    lam, w = mp.eigsy(big.T * big)
    exact = np.array((big * w * mp.diag([1 / mp.sqrt(x) for x in lam]) * w.T).tolist(),
                     dtype=float)
    assert polar_relative_error(oracle_polar(g), exact) <= 1e-12
    # The wide layout is the transpose's.
    np.testing.assert_array_equal(oracle_polar(g.T), oracle_polar(g).T)
