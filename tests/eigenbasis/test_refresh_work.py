"""What makes the block refresh cheap, held without timing: one sort per call (no
per-step column gathers), a result that does not depend on the start's memory layout,
matrices that converge early kept as they were while others step on, and the scaling
at the top of the floating-point range."""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot.testing import eigenbasis_errors

from conftest import to_numpy


def _pairs(seed: int, batch: int, n: int, rank: int, beta: float = 0.95):
    rng = np.random.default_rng(seed)
    factor = np.zeros((batch, n, n))
    for _ in range(30):
        g = rng.standard_normal((batch, n, rank)) * np.geomspace(1, 0.05, rank)
        factor = beta * factor + (1 - beta) * g @ np.swapaxes(g, -1, -2)
    g = rng.standard_normal((batch, n, rank)) * np.geomspace(1, 0.05, rank)
    return np.linalg.eigh(factor)[1], beta * factor + (1 - beta) * g @ np.swapaxes(g, -1, -2)


def test_block_refresh_sorts_once_and_gathers_only_rows():
    # Before: argsort + take_along_axis of Q and Z every step (an n×n index, remainder,
    # gather) and a where on every state array each step.
    torch = pytest.importorskip("torch")
    from torch.profiler import profile

    basis, new = _pairs(0, 3, 24, 6)
    a, q = torch.tensor(new, dtype=torch.float32), torch.tensor(basis, dtype=torch.float32)
    with profile() as prof:
        result = matroot.refresh_eigenbasis(a, q, rtol=1e-6, iterations=4, fallback="none")
    assert int(result.iterations.max()) == 4, "the case must take every step"
    counts = {e.key: e.count for e in prof.key_averages()}
    assert "aten::gather" not in counts and "aten::remainder" not in counts, counts
    assert counts.get("aten::sort", 0) == 2, "one sort to split the rows, one for the order"


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_result_does_not_depend_on_the_start_layout(library):
    # A select on the start (a NaN neighbour) or a transposed start changed the
    # rounding of the row lengths and products (nan isolation failed).
    basis, new = _pairs(1, 3, 9, 3)
    row_major = np.ascontiguousarray(basis.astype(np.float32))
    column_major = np.asfortranarray(basis.astype(np.float32))
    a = new.astype(np.float32)
    if library == "torch":
        torch = pytest.importorskip("torch")
        a, row_major = torch.tensor(a), torch.tensor(row_major)
        column_major = torch.tensor(np.swapaxes(basis, -1, -2).astype(np.float32)).mT
    one = matroot.refresh_eigenbasis(a, row_major, rtol=1e-3)
    other = matroot.refresh_eigenbasis(a, column_major, rtol=1e-3)
    for name in ("eigenvectors", "eigenvalues", "residual", "iterations"):
        assert np.array_equal(to_numpy(getattr(one, name)), to_numpy(getattr(other, name)))


def test_a_converged_matrix_keeps_its_step_while_others_go_on(backend):
    _, new = _pairs(2, 3, 16, 4)
    start = np.linalg.eigh(new)[1]  # A's own basis: converged at the first step
    start[1] = np.linalg.qr(np.random.default_rng(5).standard_normal((16, 16)))[0]
    options = dict(rtol=1e-3, iterations=6, fallback="none")
    together = matroot.refresh_eigenbasis(backend.asarray(new, "float64"),
                                          backend.asarray(start, "float64"), **options)
    steps = to_numpy(together.iterations)
    assert steps[1] > steps[0], steps
    alone = matroot.refresh_eigenbasis(backend.asarray(new[:1], "float64"),
                                       backend.asarray(start[:1], "float64"), **options)
    for name in ("eigenvectors", "eigenvalues", "residual", "iterations"):
        np.testing.assert_allclose(to_numpy(getattr(together, name))[:1],
                                   to_numpy(getattr(alone, name)), rtol=0, atol=1e-12)
    errors = eigenbasis_errors(new, to_numpy(together.eigenvectors),
                               to_numpy(together.eigenvalues))
    converged = to_numpy(together.converged)
    assert np.all(errors["reconstruction"][converged] <= 1e-3)


@pytest.mark.parametrize("largest", [3.3e38, 1.7e38, 1e-40])
def test_scaling_at_the_ends_of_float32(largest):
    # The two-pass symmetrise-and-scale divides by 2^e just above max|a_ij|; at the top
    # of the range (entries above 2^127) 2^e would overflow (NaN results before the fix).
    rng = np.random.default_rng(6)
    q = np.linalg.qr(np.eye(10) + 0.01 * rng.standard_normal((10, 10)))[0]
    a64 = (q * np.linspace(0.9, 1.0, 10) * largest) @ q.T
    a = a64.astype(np.float32)[None]
    result = matroot.refresh_eigenbasis(a, q.astype(np.float32)[None], rtol=1e-3)
    assert bool(result.converged[0])
    scale = np.abs(a).astype(np.float64).max()
    errors = eigenbasis_errors(a.astype(np.float64) / scale, result.eigenvectors,
                               result.eigenvalues.astype(np.float64) / scale)
    assert errors["reconstruction"][0] <= 1e-3 and errors["eigenvalues"][0] <= 1e-3
