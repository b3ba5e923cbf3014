"""``matroot.optim.SOAP`` (the torch shell): against the per-parameter float64 reference,
checkpoints mid-run, closure, maximize, non-finite gradients, and the cost in operations
of more same-shape layers."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from matroot.optim import SOAP  # noqa: E402
from matroot.optim.shampoo_core.config import NonFiniteGradientError  # noqa: E402
from soap_reference import ReferenceSOAP  # noqa: E402

SHAPES = [(4, 3), (4, 3), (8, 6), (7,), (3, 20)]
OPTIONS = dict(lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
               precondition_frequency=2, start_preconditioning_step=2, block_size=4,
               max_preconditioned_dim=10)


def _grads(params, rng):
    return [np.asarray(p) * (1 + 0.3 * rng.standard_normal(p.shape)) + 0.1 for p in params]


def test_matches_the_reference_in_float64():
    rng = np.random.default_rng(0)
    start = [rng.standard_normal(s) for s in SHAPES]
    params = [torch.tensor(p, requires_grad=True) for p in start]
    opt = SOAP(params, eigenbasis_rtol=1e-12, eigenbasis_iterations=4, **OPTIONS)
    ref = ReferenceSOAP(start, **OPTIONS)
    ref_params = [p.copy() for p in start]
    for _ in range(7):
        grads = _grads(ref_params, rng)
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g)
        opt.step()
        ref_params = ref.step(ref_params, grads)
        for p, r in zip(params, ref_params):
            np.testing.assert_allclose(p.detach().numpy(), r, rtol=1e-9, atol=1e-9)
    assert opt.diagnostics()["refreshes"] == 3


def _model(layers=2, width=16, seed=0):
    torch.manual_seed(seed)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 1))


def _train(model, opt, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 16, generator=gen)
        y = x.sum(1, keepdim=True).sin()

        def closure(x=x, y=y):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        losses.append(float(opt.step(closure).detach()))
    return losses


def test_state_dict_mid_run_gives_the_same_trajectory():
    model = _model()
    opt = SOAP([{"params": model[0].parameters(), "lr": 3e-3},
                {"params": list(model[2].parameters()) + list(model[4].parameters())}],
               lr=1e-2, precondition_frequency=3)
    _train(model, opt, 5, seed=1)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    expected = _train(model, opt, 7, seed=2)

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    twin = _model(seed=5)
    twin.load_state_dict(saved["model"])
    twin_opt = SOAP([{"params": twin[0].parameters(), "lr": 3e-3},
                     {"params": list(twin[2].parameters()) + list(twin[4].parameters())}],
                    lr=1e-2, precondition_frequency=3)
    twin_opt.load_state_dict(saved["opt"])
    assert _train(twin, twin_opt, 7, seed=2) == expected
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert twin_opt.diagnostics()["steps"] == 12


def test_state_dict_of_another_model_is_refused():
    model, other = _model(), _model(width=8)
    opt = SOAP(model.parameters())
    _train(model, opt, 1, seed=0)
    other_opt = SOAP(other.parameters())
    with pytest.raises(ValueError, match="another model"):
        other_opt.load_state_dict(copy.deepcopy(opt.state_dict()))


def test_training_fits_a_small_regression():
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    y = x.sum(1, keepdim=True).sin()
    model = _model()
    opt = SOAP(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(80):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.01 * losses[0], losses[::10]


def test_maximize_is_minimize_of_the_negated_loss():
    a, b = _model(), _model()
    opt_a = SOAP(a.parameters(), lr=1e-2, maximize=True, precondition_frequency=2)
    opt_b = SOAP(b.parameters(), lr=1e-2, precondition_frequency=2)
    x = torch.randn(8, 16)
    for _ in range(4):
        for model, opt, sign in ((a, opt_a, -1.0), (b, opt_b, 1.0)):
            opt.zero_grad()
            (sign * model(x).square().mean()).backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_nan_gradient(policy):
    model = _model()
    opt = SOAP(model.parameters(), nonfinite_grads=policy)
    _train(model, opt, 2, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model[0].weight.grad[0, 0] = float("nan")
    if policy == "raise":
        with pytest.raises(NonFiniteGradientError):
            opt.step()
        return
    opt.step()
    assert opt.diagnostics()["skipped_steps"] == 1 and opt.diagnostics()["steps"] == 2
    for p, q in zip(before, model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def _step_ops(layers, refresh):
    from matroot.testing.launch_count import LaunchCount
    model = _model(layers)
    opt = SOAP(model.parameters(), precondition_frequency=2)
    _train(model, opt, 2 if refresh else 1, seed=0)      # families and first refresh made
    x = torch.randn(4, 16)
    model(x).square().mean().backward()
    with LaunchCount() as count:
        opt.step()
    return count.ops, count.syncs


@pytest.mark.parametrize("refresh", [False, True])
def test_more_same_shape_layers_cost_no_more_operations(refresh):
    """Stacking: 16 more 16×16 layers (and their biases) add no operation to a step
    (the refresh step's eigh fallback, if any, is per matrix and excluded by the bound)."""
    few, many = _step_ops(2, refresh), _step_ops(18, refresh)
    assert many[1] == few[1]
    assert many[0] <= few[0] + (4 if refresh else 0), (few, many)


def test_an_eager_step_between_refreshes_keeps_its_operation_count():
    """The count measured when the step counts stayed Python ints in eager steps (a
    compiled step takes them as tensors: a fill and tensor bias corrections, 7 more
    operations, had crept into every eager step)."""
    assert _step_ops(2, refresh=False) == (38, 1)


def test_bfloat16_parameters_keep_float32_state_through_a_checkpoint():
    model = _model().to(torch.bfloat16)
    opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=2)
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    for _ in range(3):
        opt.zero_grad()
        model(x).float().square().mean().backward()
        opt.step()
    assert all(p.dtype == torch.bfloat16 and torch.isfinite(p).all()
               for p in model.parameters())
    twin = SOAP(model.parameters(), lr=1e-2, precondition_frequency=2)
    twin.load_state_dict(opt.state_dict())
    state = twin._families[0].state
    assert {a.dtype for a in state.factors + state.bases + state.block_exp_avg} == \
        {torch.float32}


def test_group_values_are_read_at_every_step():
    model = _model()
    opt = SOAP(model.parameters(), lr=1e-2, weight_decay=0.0)
    _train(model, opt, 2, seed=0)
    opt.param_groups[0]["lr"] = 0.0         # as a scheduler sets it
    before = [p.detach().clone() for p in model.parameters()]
    _train(model, opt, 1, seed=1)
    for p, q in zip(before, model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    opt.param_groups[0]["block_size"] = 8
    with pytest.raises(ValueError, match="block_size changed after the first step"):
        _train(model, opt, 1, seed=2)


def test_tensor_learning_rate_and_betas_are_taken_as_torch_adam_takes_them():
    """``lr=torch.tensor(...)`` (torch's advice for a compiled step: no recompile when a
    scheduler changes it) and tensor betas were refused ("lr must be a finite real
    number"); they stay tensors in the groups, a scheduler fills them, and the steps
    equal those with the same numbers as floats."""
    plain, tensor = _model(), _model()
    opt_plain = SOAP(plain.parameters(), lr=1e-2, betas=(0.9, 0.95), precondition_frequency=2)
    opt_tensor = SOAP(tensor.parameters(), lr=torch.tensor(1e-2, dtype=torch.float64),
                      betas=(torch.tensor(0.9, dtype=torch.float64),
                             torch.tensor(0.95, dtype=torch.float64)),
                      precondition_frequency=2)
    for opt, model in ((opt_plain, plain), (opt_tensor, tensor)):
        schedule = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
        for seed in range(4):
            _train(model, opt, 1, seed=seed)
            schedule.step()
    assert torch.is_tensor(opt_tensor.param_groups[0]["lr"])
    assert float(opt_tensor.param_groups[0]["lr"]) == opt_plain.param_groups[0]["lr"]
    for p, q in zip(plain.parameters(), tensor.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_before_the_first_refresh_soap_is_adamw():
    """What an Adam graft would supply before preconditioning starts, SOAP already is:
    with identity bases its update is AdamW's (docs/soap.rst, "Grafting")."""
    rng = np.random.default_rng(1)
    start = [torch.tensor(rng.standard_normal(s)) for s in SHAPES]
    mine = [p.clone().requires_grad_() for p in start]
    theirs = [p.clone().requires_grad_() for p in start]
    opt = SOAP(mine, **dict(OPTIONS, start_preconditioning_step=100))
    adamw = torch.optim.AdamW(theirs, lr=OPTIONS["lr"], betas=OPTIONS["betas"],
                              eps=OPTIONS["eps"], weight_decay=OPTIONS["weight_decay"])
    for _ in range(5):
        grads = _grads([p.detach().numpy() for p in mine], rng)
        for params in (mine, theirs):
            for p, g in zip(params, grads):
                p.grad = torch.tensor(g)
        opt.step()
        adamw.step()
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert opt.diagnostics()["refreshes"] == 0
