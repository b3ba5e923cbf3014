"""Shampoo allocates state lazily: frozen, unused and never-preconditioned parameters
hold none, and lazy state steps exactly as eager state."""


import numpy as np
import pytest

torch = pytest.importorskip("torch")

from matroot.optim import Shampoo, ShampooConfig, init, update  # noqa: E402
from matroot.optim.shampoo_core import core  # noqa: E402
from shampoo_torch_runs import linear_problem, run_steps  # noqa: E402


def test_frozen_and_unused_parameters_hold_no_state():
    x, y, w, b = linear_problem(0)
    frozen = torch.nn.Parameter(torch.randn(500, 64), requires_grad=False)
    unused = torch.nn.Parameter(torch.randn(40, 40))
    opt = Shampoo([w, b, frozen, unused], block_size=64, precondition_frequency=2)
    run_steps((w, b), opt, x, y, 5)
    assert frozen not in opt.state and unused not in opt.state
    assert set(opt.state) == {w, b}
    plan = opt._families[0].state.plan
    assert len(plan.params) == 3                      # the frozen one is not even planned
    # The 40x40 parameter's stack (size 40) was never allocated: no gradient reached it.
    sizes = {s.size: f for s, f in zip(plan.stacks, opt._families[0].state.factors)}
    assert sizes[40] is None and sizes[6] is not None
    assert opt.diagnostics()["state_bytes"] == core.state_bytes(opt._families[0].state)["total"]


def test_lazy_core_state_allocates_at_the_first_gradient_and_matches_eager():
    rng = np.random.default_rng(1)
    params = [rng.standard_normal((12, 5)), rng.standard_normal(5)]
    config = ShampooConfig(lr=0.05, precondition_frequency=2, block_size=8)
    lazy, eager = init(params, config, lazy=True), init(params, config)
    assert lazy.exp_avg == [None, None] and all(f is None for f in lazy.factors)
    assert core.state_bytes(lazy)["total"] == 0
    for _ in range(4):
        grads = [rng.standard_normal(p.shape) for p in params]
        u_lazy, lazy = update(grads, lazy, params, config)
        u_eager, eager = update(grads, eager, params, config)
        for a, b in zip(u_lazy, u_eager):
            np.testing.assert_array_equal(a, b)
    assert core.state_bytes(lazy) == core.state_bytes(eager)


def test_a_group_that_never_preconditions_allocates_no_factors():
    x, y, w, b = linear_problem(2)
    opt = Shampoo([{"params": [w, b], "precondition": False}], lr=1e-2)
    ref = torch.optim.AdamW([p.detach().clone().requires_grad_() for p in (w, b)], lr=1e-2)
    run_steps((w, b), opt, x, y, 12)
    run_steps(ref.param_groups[0]["params"], ref, x, y, 12)
    family = opt._families[0]
    assert family.state.plan.stacks == () and opt.diagnostics()["stacks"] == 0
    for p, q in zip((w, b), ref.param_groups[0]["params"]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
