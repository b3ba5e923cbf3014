"""The ``method="auto"`` rule: evd on CPUs, the fewest-matmul method on accelerators.

Accelerator inputs are stood in for by torch's "meta" device (a non-CPU device
that needs no GPU); the rule only looks at where the array lives.
"""

from __future__ import annotations

import numpy as np
import pytest
from array_api_compat import array_namespace

import matroot
from matroot.solvers import SOLVERS
from matroot.solvers.auto import CPU_METHOD, LOW_PRECISION_METHOD, accelerator_candidates

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("make", [
    lambda: np.eye(8, dtype=np.float32),
    lambda: np.eye(8),
    lambda: torch.eye(8),
    lambda: torch.eye(8, dtype=torch.float64),
], ids=["numpy32", "numpy64", "torch32", "torch64"])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_cpu_inputs_get_evd(make, p):
    a = make()
    assert matroot.choose_method(array_namespace(a), a, p) == CPU_METHOD == "evd"


@pytest.mark.parametrize("p, expected", [(1, "coupled_newton"), (2, "coupled_newton"),
                                         (4, "coupled_newton"), (8, "coupled_newton"),
                                         (3, "coupled_newton"), (6, "coupled_newton")])
def test_accelerator_inputs_get_the_fastest_method_measured_on_a_gpu(p, expected):
    a = torch.empty(2, 8, 8, device="meta")
    assert matroot.choose_method(array_namespace(a), a, p) == expected


def test_real_p_and_low_precision():
    a = torch.empty(2, 8, 8, device="meta")
    xp = array_namespace(a)
    assert matroot.choose_method(xp, a, 0.5) == "evd"
    assert matroot.choose_method(xp, a, 2.5) == "evd"
    assert matroot.choose_method(xp, a, 4, matmul_dtype="bfloat16") == LOW_PRECISION_METHOD
    b = np.eye(4, dtype=np.float32)
    assert matroot.choose_method(array_namespace(b), b, 2,
                                 matmul_dtype="float16") == "coupled_newton"


def test_rule_names_registered_solvers():
    assert {CPU_METHOD, LOW_PRECISION_METHOD} <= set(SOLVERS)
    for p in (1, 2, 3, 4, 8):
        assert set(accelerator_candidates(p)) <= set(SOLVERS) - {"evd"}


def test_auto_runs_what_the_rule_chose():
    a = np.diag(np.array([1.0, 4.0, 16.0], dtype=np.float32))
    res = matroot.inv_root_info(a, 2)
    assert res.method == "evd"
    np.testing.assert_allclose(res.root, np.diag([1.0, 0.5, 0.25]), rtol=1e-6)
