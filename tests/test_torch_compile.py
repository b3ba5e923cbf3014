"""inv_root under ``torch.compile(fullgraph=True)``: one graph, no host reads.

Dynamo's tracing is what ``fullgraph`` checks, so these use the ``eager``
backend (inductor's code generation adds minutes on two cores and tests torch,
not matroot). Under compilation the loops are unrolled to ``max_iter`` steps
with per-matrix freezing, so the tests use a small fixed step count.
"""

from __future__ import annotations

import numpy as np
import pytest

import matroot

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("method,steps", [("newton_db", 3), ("coupled_newton", 3),
                                          ("minimax", 3), ("chebyshev", 8)])
def test_inv_root_compiles_to_one_graph(method, steps):
    torch._dynamo.reset()
    rng = np.random.default_rng(0)
    g = rng.standard_normal((3, 8, 8))
    a = torch.asarray(g @ g.transpose(0, 2, 1) + np.eye(8), dtype=torch.float32)
    options = dict(method=method, eps=1e-2, tol=0.0, max_iter=steps)
    compiled = torch.compile(lambda x: matroot.inv_root_info(x, 4, **options),
                             fullgraph=True, backend="eager")
    traced = compiled(a)
    eager = matroot.inv_root_info(a, 4, **options)
    torch.testing.assert_close(traced.root, eager.root, rtol=1e-6, atol=1e-6)
    assert torch.equal(traced.iterations, eager.iterations)
