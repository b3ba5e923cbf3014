"""matroot graded by its own public conformance check: every registered method, on the
accuracy table and every property (NaN isolation included: matroot promises it)."""

from __future__ import annotations

import warnings

import pytest

import matroot
from matroot.solvers import SOLVERS
from matroot.testing import check_inv_root_solver

#: κ range each method is graded on (chebyshev targets κ ≲ 1e3, README).
KAPPA = {"chebyshev": (1.0, 1e3)}


def method_solver(method):
    def solve(a, p, eps):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", matroot.ConvergenceWarning)
            return matroot.inv_root(a, p, eps=eps, method=method, check_finite=False)

    solve.__name__ = f"matroot.inv_root(method={method!r})"
    return solve


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("method", sorted(SOLVERS))
def test_every_method_conforms(method, dtype):
    check_inv_root_solver(method_solver(method), dtype=dtype, method=method,
                          kappa=KAPPA.get(method, (1.0, 1e6)), max_examples=6, skip=())


@pytest.mark.parametrize("method", ["evd", "newton_db"])
def test_conforms_on_other_namespaces(backend, method):
    # Sizes to 8 only: what is checked here is the namespace, and eager JAX compiles
    # every operation once per shape (the default sizes, to 16, double its time).
    check_inv_root_solver(method_solver(method), dtype="float32", method=method,
                          xp=backend.xp, device=backend.xp_device, max_examples=3, skip=(),
                          n=(1, 8))
