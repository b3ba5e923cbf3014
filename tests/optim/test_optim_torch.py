"""matroot.optim.Shampoo as a torch.optim.Optimizer: AdamW equivalence, resume, shapes, groups."""

import copy
import io
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from matroot.optim import NonFiniteGradientError, Shampoo, ShampooConfig  # noqa: E402
from matroot.optim import apply_updates, init, update  # noqa: E402

NEVER = 10**9


class Mixed(torch.nn.Module):
    """Every parameter shape the optimizer handles: conv kernel, embedding, ragged
    linear weights, vectors, a scalar and a parameter with singleton dimensions."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 12)
        self.conv = torch.nn.Conv2d(1, 6, 3, padding=1)
        self.fc1 = torch.nn.Linear(12 + 6 * 4 * 4, 40)
        self.norm = torch.nn.LayerNorm(40)
        self.fc2 = torch.nn.Linear(40, 7)
        self.temperature = torch.nn.Parameter(torch.tensor(1.5))
        self.gate = torch.nn.Parameter(torch.randn(1, 7, 1))

    def forward(self, tokens, images):
        h = torch.cat([self.embed(tokens), self.conv(images).flatten(1)], dim=1)
        h = torch.relu(self.norm(self.fc1(h)))
        return self.fc2(h) * self.temperature * self.gate[0, :, 0]


def _data(seed=0, n=16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 50, (n,), generator=g), torch.randn(n, 1, 4, 4, generator=g),
            torch.randint(0, 7, (n,), generator=g))


def _loss(model, data):
    tokens, images, labels = data
    return torch.nn.functional.cross_entropy(model(tokens, images), labels)


def _train(model, opt, steps, data=None, scheduler=None):
    data = data or _data()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = _loss(model, data)
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(float(loss.detach()))
    return losses


def _pair(seed=0):
    torch.manual_seed(seed)
    a = Mixed()
    return a, copy.deepcopy(a)


HYPER = dict(lr=3e-3, betas=(0.85, 0.98), eps=1e-7, weight_decay=0.05)


def _assert_same_params(a, b, rtol=2e-5, atol=2e-6):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=rtol, atol=atol, msg=name)


def test_unpreconditioned_shampoo_follows_adamw_for_20_steps():
    a, b = _pair()
    _train(a, Shampoo(a.parameters(), start_preconditioning_step=NEVER, block_size=16,
                      **HYPER), 20)
    _train(b, torch.optim.AdamW(b.parameters(), **HYPER), 20)
    _assert_same_params(a, b)
    # The comparison can fail: after 20 steps the parameters moved far beyond it.
    c, _ = _pair()
    assert (a.fc1.weight - c.fc1.weight).abs().max() > 100 * 2e-5


def test_lr_scheduler_drives_the_same_trajectory_as_adamw():
    a, b = _pair(1)
    opt_a = Shampoo(a.parameters(), start_preconditioning_step=NEVER, **HYPER)
    opt_b = torch.optim.AdamW(b.parameters(), **HYPER)
    sched_a = torch.optim.lr_scheduler.StepLR(opt_a, step_size=4, gamma=0.3)
    sched_b = torch.optim.lr_scheduler.StepLR(opt_b, step_size=4, gamma=0.3)
    _train(a, opt_a, 12, scheduler=sched_a)
    _train(b, opt_b, 12, scheduler=sched_b)
    assert opt_a.param_groups[0]["lr"] == pytest.approx(HYPER["lr"] * 0.3 ** 3)
    _assert_same_params(a, b)


def _spd(n, kappa, g):
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return ((q * torch.logspace(0, -math.log10(kappa), n, dtype=torch.float64)) @ q.T).float()


def _steps_to_solve(make, a, b, w_star, target=1e-4, cap=1200):
    w = torch.zeros_like(w_star, requires_grad=True)
    opt = make([w])

    def f():
        e = w - w_star
        return 0.5 * torch.trace(e.T @ a @ e @ b)

    f0 = float(f().detach())
    for t in range(1, cap + 1):
        opt.zero_grad()
        f().backward()
        opt.step()
        if float(f().detach()) <= target * f0:
            return t
    return cap


def test_shampoo_solves_an_ill_conditioned_quadratic_in_far_fewer_steps():
    # f(W) = tr((W−W*)ᵀ A (W−W*) B)/2 with rotated A, B of condition 1e3 each:
    # the Hessian A⊗B has condition 1e6 and no diagonal structure for Adam.
    g = torch.Generator().manual_seed(1)
    a, b = _spd(20, 1e3, g), _spd(16, 1e3, g)
    w_star = torch.randn(20, 16, generator=g)
    lrs = (0.1, 0.3, 1.0)
    adam = min(_steps_to_solve(lambda p, lr=lr: torch.optim.AdamW(p, lr=lr, weight_decay=0),
                               a, b, w_star) for lr in lrs)
    shampoo = min(_steps_to_solve(lambda p, lr=lr: Shampoo(p, lr=lr, weight_decay=0,
                                                           precondition_frequency=1),
                                  a, b, w_star) for lr in lrs)
    assert shampoo * 3 <= adam, (shampoo, adam)


def _mixed_dtype_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(10, 24), torch.nn.Tanh(),
                                torch.nn.Linear(24, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3))
    model[2].to(torch.bfloat16)
    model[4].to(torch.float64)
    return model


def _mixed_loss(model, x, y):
    h = torch.tanh(model[0](x))
    h = torch.tanh(model[2](h.bfloat16()).float())
    return torch.nn.functional.mse_loss(model[4](h.double()).float(), y)


def _mixed_steps(model, opt, steps, x, y):
    for _ in range(steps):
        opt.zero_grad()
        _mixed_loss(model, x, y).backward()
        opt.step()


def test_state_dict_round_trip_resumes_bit_identically_with_mixed_dtypes():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(32, 10, generator=g), torch.randn(32, 3, generator=g)
    kwargs = dict(lr=1e-2, block_size=16, precondition_frequency=3, nesterov=True)
    model = _mixed_dtype_model(0)
    opt = Shampoo(model.parameters(), **kwargs)
    _mixed_steps(model, opt, 7, x, y)

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = _mixed_dtype_model(1)
    resumed.load_state_dict(saved["model"])
    resumed_opt = Shampoo(resumed.parameters(), **kwargs)
    resumed_opt.load_state_dict(saved["opt"])

    bf16 = resumed[2].weight
    assert bf16.dtype == torch.bfloat16
    assert resumed_opt.state[bf16]["exp_avg"].dtype == torch.float32
    family = resumed_opt._families[0]
    assert {f.dtype for f in family.state.factors} == {torch.float32, torch.float64}

    _mixed_steps(model, opt, 6, x, y)
    _mixed_steps(resumed_opt_model := resumed, resumed_opt, 6, x, y)
    for p, q in zip(model.parameters(), resumed_opt_model.parameters()):
        assert p.dtype == q.dtype
        assert torch.equal(p, q)
    assert opt.diagnostics() == resumed_opt.diagnostics()


def test_plain_torch_load_of_a_state_dict_would_lose_precision():
    # What the override protects against: torch's own cast of float32 state to bf16.
    model = _mixed_dtype_model(0)
    opt = Shampoo(model.parameters(), block_size=16)
    g = torch.Generator().manual_seed(4)
    _mixed_steps(model, opt, 2, torch.randn(8, 10, generator=g), torch.randn(8, 3, generator=g))
    sd = opt.state_dict()
    plain = torch.optim.Optimizer.load_state_dict
    fresh = Shampoo(model.parameters(), block_size=16)
    plain(fresh, {k: v for k, v in sd.items() if k != "shampoo_families"})
    assert fresh.state[model[2].weight]["exp_avg"].dtype == torch.bfloat16


@pytest.mark.parametrize("precondition_1d", [False, True])
def test_every_parameter_shape_trains(precondition_1d):
    torch.manual_seed(5)
    model = Mixed()
    opt = Shampoo(model.parameters(), lr=1e-2, block_size=16, precondition_frequency=2,
                  precondition_1d=precondition_1d)
    before = [p.detach().clone() for p in model.parameters()]
    losses = _train(model, opt, 12)
    assert losses[-1] < 0.7 * losses[0]
    for p, p0 in zip(model.parameters(), before):
        assert torch.all(torch.isfinite(p)) and not torch.equal(p, p0)
    info = opt.diagnostics()
    assert info["root_failures"] == 0 and info["root_refreshes"] == 6
    kinds = [layout.kind for layout in opt._families[0].state.plan.params]
    names = [n for n, _ in model.named_parameters()]
    vector = "vector" if precondition_1d else "elementwise"
    expected = {"embed.weight": "matrix", "conv.weight": "matrix", "fc1.bias": vector,
                "temperature": "elementwise", "gate": vector}
    for name, kind in expected.items():
        assert kinds[names.index(name)] == kind


def test_zero_gradients_at_step_one_with_preconditioning_from_step_one():
    torch.manual_seed(6)
    model = Mixed()
    opt = Shampoo(model.parameters(), lr=0.1, weight_decay=0.5, precondition_frequency=1,
                  matrix_eps=0.0)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for p, p0 in zip(model.parameters(), before):
        torch.testing.assert_close(p, p0 * (1 - 0.1 * 0.5), rtol=1e-6, atol=0)


def test_nan_gradient_raises_by_default_and_skips_when_asked():
    torch.manual_seed(7)
    model = Mixed()
    opt = Shampoo(model.parameters())
    _train(model, opt, 2)
    _loss(model, _data()).backward()
    model.fc1.weight.grad[3, 4] = float("nan")
    with pytest.raises(NonFiniteGradientError, match="NaN or Inf"):
        opt.step()

    skipping = Shampoo(model.parameters(), nonfinite_grads="skip")
    _train(model, skipping, 2)
    snapshot = copy.deepcopy(skipping.state_dict())
    before = [p.detach().clone() for p in model.parameters()]
    skipping.zero_grad()
    _loss(model, _data()).backward()
    model.fc2.bias.grad[0] = float("inf")
    skipping.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert skipping.diagnostics()["skipped_steps"] == 1
    after = skipping.state_dict()
    for index, entries in snapshot["state"].items():
        for key, value in entries.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(after["state"][index][key]))


def test_group_added_mid_training_gets_its_own_stacks_and_schedule():
    torch.manual_seed(8)
    model = Mixed()
    extra = torch.nn.Linear(7, 5)
    twin = copy.deepcopy(extra)
    kwargs = dict(block_size=16, precondition_frequency=2)
    opt = Shampoo(model.parameters(), lr=1e-2, **kwargs)
    data = _data()
    _train(model, opt, 3, data)
    opt.add_param_group({"params": extra.parameters(), "lr": 5e-2})
    alone = Shampoo(twin.parameters(), lr=5e-2, **kwargs)
    g = torch.Generator().manual_seed(9)
    for _ in range(5):
        x = torch.randn(8, 7, generator=g)
        for net, o in ((extra, opt), (twin, alone)):
            o.zero_grad()
            loss = net(x).square().mean()
            if o is opt:
                loss = loss + _loss(model, data)
            loss.backward()
            o.step()
    assert len(opt._families) == 2
    assert opt._families[1].state.step == 5 and opt._families[0].state.step == 8
    for p, q in zip(extra.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_groups_differing_only_in_lr_and_weight_decay_share_stacks():
    torch.manual_seed(10)
    model = Mixed()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    frozen_lr = Shampoo([{"params": decay, "lr": 0.0, "weight_decay": 0.0},
                         {"params": rest, "weight_decay": 0.0}], lr=1e-2, block_size=16)
    before = [p.detach().clone() for p in decay]
    _train(model, frozen_lr, 3)
    assert len(frozen_lr._families) == 1
    assert all(torch.equal(p, q) for p, q in zip(decay, before))
    split = Shampoo([{"params": decay}, {"params": rest, "betas": (0.5, 0.9)}], block_size=16)
    _train(model, split, 1)
    assert len(split._families) == 2
    frozen_lr.param_groups[1]["betas"] = (0.5, 0.9)
    with pytest.raises(ValueError, match="share Shampoo factor stacks"):
        _train(model, frozen_lr, 1)


def test_closure_returns_the_loss():
    torch.manual_seed(11)
    model = Mixed()
    opt = Shampoo(model.parameters())
    data = _data()

    def closure():
        opt.zero_grad()
        loss = _loss(model, data)
        loss.backward()
        return loss

    first = opt.step(closure)
    second = opt.step(closure)
    assert float(second.detach()) < float(first.detach())


def test_unused_parameters_are_left_alone():
    torch.manual_seed(12)
    model = Mixed()
    unused = torch.nn.Parameter(torch.randn(6, 6))
    opt = Shampoo(list(model.parameters()) + [unused], weight_decay=0.1)
    before = unused.detach().clone()
    _train(model, opt, 3)
    assert torch.equal(unused, before) and unused not in opt.state


def test_torch_shell_and_numpy_core_give_the_same_updates():
    torch.manual_seed(13)
    model = torch.nn.Sequential(torch.nn.Linear(9, 20), torch.nn.ReLU(), torch.nn.Linear(20, 4))
    kwargs = dict(lr=1e-2, block_size=8, precondition_frequency=2, root_method="evd",
                  weight_decay=0.01)
    params = [p.detach().numpy().copy() for p in model.parameters()]
    config = ShampooConfig(**kwargs)
    state = init(params, config)
    opt = Shampoo(model.parameters(), **kwargs)
    g = torch.Generator().manual_seed(14)
    for _ in range(6):
        x, y = torch.randn(16, 9, generator=g), torch.randn(16, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        opt.step()
        updates, state = update(grads, state, params, config)
        params = apply_updates(params, updates)
        for p, q in zip(model.parameters(), params):
            np.testing.assert_allclose(p.detach().numpy(), q, rtol=1e-5, atol=1e-6)
    assert state.root_refreshes == 3
