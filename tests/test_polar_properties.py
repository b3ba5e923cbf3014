"""matroot.polar's properties (check_polar_solver), and the same results under
``jax.jit`` and ``torch.compile(fullgraph=True)`` as eagerly."""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot.polar_accuracy import polar_error_bound
from matroot.testing import check_polar_solver, polar_case, polar_relative_error


@pytest.mark.parametrize("method,dtype,kappa", [("polar_express", "float64", (1.0, 1e5)),
                                                ("polar_express", "float32", (1.0, 1e3)),
                                                ("gram_newton_schulz", "float32", (1.0, 1e3)),
                                                ("svd", "float32", (1.0, 1e3))])
def test_conformance(method, dtype, kappa):
    check_polar_solver(lambda g: matroot.polar_info(g, method=method).root, dtype=dtype,
                       kappa=kappa, method=method, max_examples=8)


def test_conformance_catches_the_unconverged_quintic():
    with pytest.raises(AssertionError, match="accuracy"):
        check_polar_solver(lambda g: matroot.polar_info(g, method="quintic").root,
                           max_examples=5)


def test_conformance_on_torch_and_strict():
    for module in ("array_api_compat.torch", "array_api_strict"):
        xp = pytest.importorskip(module)
        check_polar_solver(matroot.polar, xp=xp, max_examples=4)


@pytest.mark.parametrize("method", ["polar_express", "svd", "gram_newton_schulz"])
def test_jax_jit_matches_eager(method):
    jax = pytest.importorskip("jax")
    case = polar_case(np.random.default_rng(0), (3,), 9, 6, 100.0)
    g = jax.numpy.asarray(case.g.astype(np.float32))
    traced = jax.jit(lambda x: matroot.polar_info(x, method=method))(g)
    eager = matroot.polar_info(g, method=method)
    assert bool(traced.converged.all()) and bool(eager.converged.all())
    # Two compiled programs (XLA may fuse differently): both within the table of the
    # exact factor, so within twice its bound of each other.
    distance = polar_relative_error(np.asarray(traced.root), np.asarray(eager.root, np.float64))
    assert np.all(distance <= 2 * polar_error_bound("float32", case.kappa, method=method))


@pytest.mark.compile
@pytest.mark.parametrize("method", ["polar_express", "quintic", "svd"])
def test_torch_compile_fullgraph_matches_eager(method):
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    case = polar_case(np.random.default_rng(1), (3,), 6, 10, 100.0)
    g = torch.asarray(case.g.astype(np.float32))
    compiled = torch.compile(lambda x: matroot.polar_info(x, method=method),
                             fullgraph=True, backend="eager")
    traced, eager = compiled(g), matroot.polar_info(g, method=method)
    torch.testing.assert_close(traced.root, eager.root, rtol=1e-5, atol=1e-5)
    assert torch.equal(traced.converged, eager.converged)
