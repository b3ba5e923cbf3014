"""The fixed-step runs (:mod:`matroot.solvers.fixed_runs`) carry their host factors, and
the one a caller asks for, onto their last product: the root is ``host_factor·matrix``
with ``host_factor`` 1 wherever the run has a last product, for every method and
stage count, and the run of one step, which has none, hands the factor back."""

from __future__ import annotations

import numpy as np
import pytest

from matroot import _xp
from matroot.solvers.fixed_runs import run_fixed
from matroot.solvers.fixed_steps import FixedPlan, fixed_plan
from matroot.testing import oracle_inv_root, relative_error


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("method", ["minimax", "newton_db", "coupled_newton"])
def test_the_factor_rides_on_the_last_product(method, p):
    a = np.diag([2.0, 0.6, 0.1, 0.02])[None]  # 0.5·a spans the planned [0.01, 1]
    plan = fixed_plan(method, p, 0.01, 1e-12, 2.0 ** -53)
    matrix, factor = run_fixed(method, a, p, plan, _xp.Matmul(np), a_factor=0.5,
                               out_factor=0.25)
    assert factor == 1.0
    expected = 0.25 * oracle_inv_root(0.5 * a, p)
    assert relative_error(matrix, expected)[0] < 1e-10


@pytest.mark.parametrize("method", ["minimax", "newton_db", "coupled_newton"])
def test_a_run_of_one_step_hands_the_factor_back(method):
    """One step from Z = I forms no product with Z: the factor comes back instead
    (minimax's schedules are at least two steps long: its first alone here)."""
    a = np.diag([1.0, 0.97])[None]
    plan = fixed_plan(method, 2, 0.96, 0.5, 2.0 ** -53)
    if method == "minimax":
        plan = FixedPlan((1,), (plan.coefficients[0][:1],), plan.lower)
    assert plan.total == 1
    matrix, factor = run_fixed(method, a, 2, plan, _xp.Matmul(np), out_factor=0.25)
    loose = 0.25 * oracle_inv_root(a, 2)
    assert factor != 1.0
    assert relative_error(factor * matrix, loose)[0] < 0.1  # one step: loose, not 4× off
