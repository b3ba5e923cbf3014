"""Input forms nobody here wrote: bound and eps arrays of any library, masked arrays,
meta tensors, entries near the largest float, huge ``max_iter``.

Each test names what it found before its fix: a raw error where a clear ValueError or
TypeError belongs, an input silently computed at the wrong precision, or a limit that
ran out of memory.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import matroot
from matroot.testing import oracle_inv_root, relative_error


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
