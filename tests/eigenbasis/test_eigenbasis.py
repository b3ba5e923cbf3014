"""refresh_eigenbasis against the float64 eigh oracle on every backend, eager and compiled:
the promise of ``converged`` (matroot.testing.check_eigenbasis_refresh), adversarial
spectra, NaN isolation, fallback only where needed, validation."""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot.testing import check_eigenbasis_refresh, eigenbasis_errors
from matroot.testing.eigenbasis import eigenbasis_case

from conftest import to_numpy
from tiers import examples


def _soap_pair(rng, batch: int, n: int, rank: int, beta: float = 0.95):
    """A Shampoo factor after many steps, its eigenbasis, and the factor one step later."""
    factor = np.zeros((batch, n, n))
    directions = np.linalg.qr(rng.standard_normal((batch, n, rank)))[0]
    for _ in range(40):
        directions = np.linalg.qr(directions + 0.1 * rng.standard_normal(directions.shape)
                                  / np.sqrt(n))[0]
        g = directions * np.geomspace(1, 0.05, rank)
        factor = beta * factor + (1 - beta) * g @ np.swapaxes(g, -1, -2)
    basis = np.linalg.eigh(factor)[1]
    g = directions * np.geomspace(1, 0.05, rank)
    return factor, basis, beta * factor + (1 - beta) * g @ np.swapaxes(g, -1, -2)


def _graded(result, a, rtol):
    errors = eigenbasis_errors(a, result.eigenvectors, result.eigenvalues)
    converged = to_numpy(result.converged)
    for what in ("reconstruction", "eigenvalues"):
        assert np.all(errors[what][converged] <= rtol), (what, errors[what], converged)
    return errors, converged


@pytest.mark.parametrize("method", ["block", "orthogonal"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_soap_refresh_converges_without_fallback(backend, dtype, method):
    rng = np.random.default_rng(0)
    _, basis, new = _soap_pair(rng, 3, 24, 4)
    a, q = backend.asarray(new, dtype), backend.asarray(basis, dtype)
    result = matroot.refresh_eigenbasis(a, q, method=method)
    errors, converged = _graded(result, a, 1e-2)
    assert converged.all() and not to_numpy(result.fell_back).any()
    assert type(result.eigenvectors) is type(a)
    assert str(result.eigenvectors.dtype) == str(a.dtype) == str(result.eigenvalues.dtype)
    assert tuple(result.residual.shape) == (3,)
    assert np.all(np.diff(to_numpy(result.eigenvalues), axis=-1) >= 0), "ascending, as eigh"


@pytest.mark.parametrize("method", ["block", "orthogonal"])
def test_conformance_numpy_float32(method):
    check_eigenbasis_refresh(
        lambda a, q: matroot.refresh_eigenbasis(a, q, rtol=1e-3, method=method),
        rtol=1e-3, max_examples=examples(40))


@pytest.mark.parametrize("method", ["block", "orthogonal"])
def test_conformance_without_fallback_float64(method):
    check_eigenbasis_refresh(
        lambda a, q: matroot.refresh_eigenbasis(a, q, rtol=1e-6, fallback="none",
                                                method=method),
        rtol=1e-6, dtype="float64", max_examples=examples(40))


def test_block_method_bounds_the_orthogonality_it_cannot_restore():
    # Exact eigenvectors, one column repeated: every column's residual is 0, but the
    # basis is singular. The block method keeps what it is given; only the probed
    # bound on ‖QᵀQ − I‖ can tell (without it this came back converged).
    rng = np.random.default_rng(9)
    q = np.linalg.qr(rng.standard_normal((2, 12, 12)))[0]
    a = (q * np.arange(1.0, 13.0)[None, None, :]) @ np.swapaxes(q, -1, -2)
    basis = q.copy()
    basis[:, :, 3] = basis[:, :, 4]
    result = matroot.refresh_eigenbasis(a, basis, fallback="none", block=2, rtol=0.5)
    assert not result.converged.any()
    assert matroot.refresh_eigenbasis(a, basis, block=2, rtol=0.5).fell_back.all()


def test_conformance_torch():
    torch = pytest.importorskip("torch")
    check_eigenbasis_refresh(lambda a, q: matroot.refresh_eigenbasis(a, q, rtol=1e-3),
                             rtol=1e-3, xp=torch, max_examples=15)


def test_conformance_catches_a_wrong_promise():
    def liar(a, q):
        result = matroot.refresh_eigenbasis(a, q, rtol=0.5, fallback="none")
        return result._replace(converged=np.ones_like(result.converged))

    with pytest.raises(AssertionError, match="promise"):
        check_eigenbasis_refresh(liar, rtol=1e-6, dtype="float64", n=(4, 8), max_examples=30,
                                 skip=("namespace", "nan_isolation"))


@pytest.mark.parametrize("family", ["clustered", "repeated", "gram", "zero", "isolated_top",
                                    "scale_extremes"])
@pytest.mark.parametrize("start", ["exact", "shuffled", "scaled"])
def test_adversarial_spectra(backend, family, start):
    rng = np.random.default_rng(7)
    case = eigenbasis_case(rng, family=family, n=9, batch=(4,), kappa=1e5, exponent=-60,
                           beta=0.95, rank=2, start=start, dtype="float32", xp=backend.xp,
                           device=backend.xp_device)
    result = matroot.refresh_eigenbasis(case.a, case.basis, rtol=1e-3)
    errors, converged = _graded(result, case.a, 1e-3)
    assert converged.all(), "eigh's pairs meet 1e-3 in float32"
    assert np.all(errors["orthogonality"] <= 4 * 11 * 2.0 ** -24)


def test_zero_matrix_keeps_its_basis_orthonormalised(backend):
    q = np.linalg.qr(np.random.default_rng(1).standard_normal((2, 5, 5)))[0]
    result = matroot.refresh_eigenbasis(backend.asarray(np.zeros((2, 5, 5)), "float64"),
                                        backend.asarray(q, "float64"))
    assert to_numpy(result.converged).all() and not to_numpy(result.fell_back).any()
    assert np.all(to_numpy(result.eigenvalues) == 0)
    assert np.allclose(np.abs(to_numpy(result.eigenvectors)), np.abs(q), atol=1e-12)


def test_nan_matrix_changes_no_neighbour(backend):
    rng = np.random.default_rng(2)
    _, basis, new = _soap_pair(rng, 4, 12, 3)
    clean = matroot.refresh_eigenbasis(backend.asarray(new, "float32"),
                                       backend.asarray(basis, "float32"))
    new[2, 3, 4] = np.nan
    poisoned = matroot.refresh_eigenbasis(backend.asarray(new, "float32"),
                                          backend.asarray(basis, "float32"))
    assert not to_numpy(poisoned.converged)[2] and not to_numpy(poisoned.fell_back)[2]
    assert np.isnan(to_numpy(poisoned.eigenvalues)[2]).all()
    for name in ("eigenvectors", "eigenvalues", "residual", "converged", "iterations"):
        got, want = to_numpy(getattr(poisoned, name)), to_numpy(getattr(clean, name))
        assert np.array_equal(np.delete(got, 2, axis=0), np.delete(want, 2, axis=0)), name


def test_nan_basis_falls_back_to_eigh_for_that_matrix_only(backend):
    # A NaN basis starts from the identity: one step cannot resolve a rank-5 factor.
    rng = np.random.default_rng(3)
    _, basis, new = _soap_pair(rng, 3, 10, 5)
    basis[1] = np.nan
    result = matroot.refresh_eigenbasis(backend.asarray(new, "float64"),
                                        backend.asarray(basis, "float64"), iterations=1)
    assert to_numpy(result.fell_back).tolist() == [False, True, False]
    assert result.fallbacks == 1
    _, converged = _graded(result, backend.asarray(new, "float64"), 1e-2)
    assert converged.all()


def test_fallback_only_where_needed_and_none_keeps_the_iterate():
    rng = np.random.default_rng(4)
    factor, basis, new = _soap_pair(rng, 3, 16, 3)
    new[1] = np.eye(16)[::-1] @ new[1] @ np.eye(16)[::-1] + 0.5 * factor[1]  # far from basis
    result = matroot.refresh_eigenbasis(new, basis, rtol=1e-6, iterations=1)
    kept = matroot.refresh_eigenbasis(new, basis, rtol=1e-6, iterations=1, fallback="none")
    assert result.fell_back[1] and result.converged.all()
    unchanged = ~result.fell_back
    assert np.array_equal(result.eigenvectors[unchanged], kept.eigenvectors[unchanged])
    assert not kept.fell_back.any() and not kept.converged[1]


def test_batch_shape_and_float16_come_back(backend):
    rng = np.random.default_rng(5)
    _, basis, new = _soap_pair(rng, 4, 6, 2)
    dtype = "bfloat16" if backend.backend == "torch" else "float16"
    if not hasattr(backend.xp, dtype):
        pytest.skip(f"{backend.name} has no {dtype}")
    a = backend.asarray(new.reshape(2, 2, 6, 6), dtype)
    result = matroot.refresh_eigenbasis(a, backend.asarray(basis.reshape(2, 2, 6, 6), dtype))
    assert tuple(result.eigenvectors.shape) == (2, 2, 6, 6)
    assert tuple(result.converged.shape) == (2, 2)
    assert str(result.eigenvalues.dtype) == str(a.dtype)


def test_empty_stack(backend):
    a = backend.asarray(np.zeros((0, 3, 3)), "float32")
    result = matroot.refresh_eigenbasis(a, a)
    assert tuple(result.eigenvectors.shape) == (0, 3, 3)


@pytest.mark.parametrize("options, error, match", [
    (dict(iterations=0), ValueError, "iterations=0"),
    (dict(iterations=2.0), TypeError, "iterations must be an int"),
    (dict(rtol=0.0), ValueError, r"rtol=0.0 must be in \(0, 1\)"),
    (dict(rtol=float("nan")), ValueError, "rtol=nan"),
    (dict(fallback="qr"), ValueError, "fallback='qr'"),
    (dict(method="lanczos"), ValueError, "method='lanczos'"),
    (dict(block=4), ValueError, "block=4 must be from 1 to 3"),
])
def test_bad_options(options, error, match):
    with pytest.raises(error, match=match):
        matroot.refresh_eigenbasis(np.eye(3), np.eye(3), **options)


def test_bad_arrays():
    with pytest.raises(ValueError, match="basis must have a's shape"):
        matroot.refresh_eigenbasis(np.eye(3), np.eye(4))
    with pytest.raises(ValueError, match="square"):
        matroot.refresh_eigenbasis(np.ones((3, 4)), np.ones((3, 4)))
    with pytest.raises(TypeError, match="integer"):
        matroot.refresh_eigenbasis(np.eye(3, dtype=int), np.eye(3))
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="basis must be an array of a's library"):
        matroot.refresh_eigenbasis(np.eye(3), torch.eye(3, dtype=torch.float64))


def test_jax_jit_matches_eager_and_falls_back_by_where():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    rng = np.random.default_rng(3)
    _, basis, new = _soap_pair(rng, 3, 10, 5)
    basis[2] = np.nan  # that matrix needs eigh (test_nan_basis_falls_back...)
    a, q = jnp.asarray(new, dtype=jnp.float32), jnp.asarray(basis, dtype=jnp.float32)
    eager = matroot.refresh_eigenbasis(a, q, iterations=1)
    jitted = jax.jit(lambda a, q: matroot.refresh_eigenbasis(a, q, iterations=1))(a, q)
    assert np.asarray(jitted.fell_back).tolist() == [False, False, True]
    assert np.asarray(jitted.converged).all()
    for name in ("eigenvalues", "residual"):
        assert np.allclose(np.asarray(getattr(jitted, name)), np.asarray(getattr(eager, name)),
                           rtol=1e-4, atol=1e-6), name
    _graded(jitted, a, 1e-2)
    with pytest.raises(TypeError, match="rtol is traced"):
        jax.jit(lambda a, q, r: matroot.refresh_eigenbasis(a, q, rtol=r))(a, q, 1e-2)


def test_torch_compile_matches_eager():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    _, basis, new = _soap_pair(rng, 3, 10, 5)
    basis[0] = np.nan  # that matrix needs eigh (test_nan_basis_falls_back...)
    a, q = torch.tensor(new, dtype=torch.float32), torch.tensor(basis, dtype=torch.float32)
    eager = matroot.refresh_eigenbasis(a, q, iterations=1)
    compiled = torch.compile(lambda a, q: matroot.refresh_eigenbasis(a, q, iterations=1))(a, q)
    assert compiled.fell_back.tolist() == eager.fell_back.tolist() == [True, False, False]
    assert torch.allclose(compiled.eigenvalues, eager.eigenvalues, rtol=1e-4, atol=1e-6)
    assert compiled.converged.all()
    _graded(compiled, a, 1e-2)
    # A NaN matrix under torch.compile: inductor folds x·0 to 0, so a finiteness test
    # by sum(x·0) == 0 let it through (the refresh then failed in its SVD).
    a[2, 0, 0] = float("nan")
    compiled = torch.compile(lambda a, q: matroot.refresh_eigenbasis(a, q, iterations=1))(a, q)
    assert compiled.converged.tolist() == [True, True, False]
    assert torch.isnan(compiled.eigenvalues[2]).all()


def test_eigenbasis_cases_refuse_bad_arguments():
    from matroot.testing import eigenbasis_cases

    with pytest.raises(ValueError, match="unknown families or starts"):
        eigenbasis_cases(families=["nope"])
    with pytest.raises(ValueError, match="unknown families or starts"):
        eigenbasis_cases(starts=["upside_down"])
    with pytest.raises(ValueError, match="n=0"):
        eigenbasis_cases(n=0)
    with pytest.raises(TypeError, match="refresh must be a function"):
        check_eigenbasis_refresh("block", rtol=1e-2)
    with pytest.raises(ValueError, match="unknown properties"):
        check_eigenbasis_refresh(matroot.refresh_eigenbasis, rtol=1e-2, skip=["speed"])
