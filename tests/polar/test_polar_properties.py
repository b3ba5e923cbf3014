"""matroot.polar's properties (check_polar_solver), and the same results under
``jax.jit`` and ``torch.compile(fullgraph=True)`` as eagerly."""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot.certify.polar_accuracy import polar_error_bound
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
    """The default backend (inductor), whole graph: no graph break, no host read.
    A second batch size recompiles with a dynamic batch dimension."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: matroot.polar_info(x, method=method), fullgraph=True)
    for seed, batch in ((1, 3), (2, 5)):
        case = polar_case(np.random.default_rng(seed), (batch,), 6, 10, 100.0)
        g = torch.asarray(case.g.astype(np.float32))
        traced, eager = compiled(g), matroot.polar_info(g, method=method)
        assert torch.equal(traced.converged, eager.converged)
        assert torch.equal(traced.matmuls, eager.matmuls)
        # Two programs (inductor fuses and reorders): each within the table of the
        # exact factor, so within twice its bound of each other (the quintic, never
        # converged, within the same float32 allowance of its own eager result).
        distance = polar_relative_error(traced.root.numpy(), eager.root.double().numpy())
        assert np.all(distance <= 2 * polar_error_bound("float32", case.kappa, method=method))


@pytest.mark.compile
def test_torch_compile_of_the_plain_function_with_bfloat16_products():
    """matroot.polar (its warning check reads nothing when traced) with 16-bit operands:
    the compiled factor meets the bfloat16 row of the table against the exact factor."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    case = polar_case(np.random.default_rng(4), (3,), 10, 6, 100.0)
    g = torch.asarray(case.g.astype(np.float32))
    compiled = torch.compile(lambda x: matroot.polar(x, matmul_dtype="bfloat16"),
                             fullgraph=True)
    error = polar_relative_error(compiled(g).numpy(), case.polar)
    assert np.all(error <= polar_error_bound("bfloat16", case.kappa))
