"""Stacked Muon: the core against a per-parameter loop, the torch shell against
torch.optim.Muon, resume, schedulers, the optax shell, and training on digits."""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot.optim.muon.core import (MuonConfig, default_use_muon, matrix_stack_shape,
                                muon_directions, muon_init, shape_scale)

torch = pytest.importorskip("torch")
from torch_muon_reference import use_float32_iterates  # noqa: E402

SHAPES = [(6, 4), (6, 4), (3, 6, 4), (4, 6), (5, 2, 3, 3), (7,)]
USE_MUON = [True, True, True, True, True, False]


def _loop_reference(grads, config, steps):
    """Muon one parameter at a time, written from the formulas (float64)."""
    mu = config.momentum
    momentum = [np.zeros(s) for s in SHAPES]
    out = []
    for _ in range(steps):
        out = []
        for i, g in enumerate(grads):
            if not USE_MUON[i]:
                out.append(None)
                continue
            momentum[i] = mu * momentum[i] + (1 - mu) * g
            u = (1 - mu) * g + mu * momentum[i]
            count, m, n = matrix_stack_shape(g.shape)
            factor = matroot.polar(u.reshape(count, m, n), method="svd").reshape(g.shape)
            out.append(factor * shape_scale(m, n, config.shape_scale))
    return out


@pytest.mark.parametrize("convention", ["original", "match_rms_adamw"])
def test_stacked_directions_equal_the_per_parameter_loop(convention):
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(s) for s in SHAPES]
    # Converged polar factors (float64, schedule to the default rtol) to compare with SVD.
    config = MuonConfig(shape_scale=convention, polar_steps=40, polar_lower=1e-6)
    state = muon_init(grads, USE_MUON)
    for _ in range(3):
        directions, state = muon_directions(grads, state, USE_MUON, config)
    reference = _loop_reference(grads, config, 3)
    for d, r in zip(directions, reference):
        if r is not None:
            np.testing.assert_allclose(d, r, atol=1e-9)
    assert state.steps == [3] * len(SHAPES)


def test_stacked_default_directions_equal_one_call_per_parameter():
    """The default polar factor (4 Polar Express steps, not converged) depends on each
    matrix's certified scale, which must not depend on its neighbours in the stack:
    stacked and one-matrix calls agree to float64 rounding (different batch sizes may
    round differently in BLAS, so not bitwise)."""
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(s) for s in SHAPES]
    config = MuonConfig()
    state = muon_init(grads, USE_MUON)
    alone = [muon_init([g], [muon]) for g, muon in zip(grads, USE_MUON)]
    for _ in range(3):
        stacked, state = muon_directions(grads, state, USE_MUON, config)
        looped = []
        for i, (g, muon) in enumerate(zip(grads, USE_MUON)):
            (d,), alone[i] = muon_directions([g], alone[i], [muon], config)
            looped.append(d)
    for d, r in zip(stacked, looped):
        np.testing.assert_allclose(d, r, rtol=1e-10, atol=1e-12)


def test_adamw_part_is_bias_corrected_adam():
    g = np.array([0.5, -2.0, 0.0])
    config = MuonConfig(betas=(0.9, 0.99), eps=1e-8)
    state = muon_init([g], [False])
    d, state = muon_directions([g], state, [False], config)
    np.testing.assert_allclose(d[0], g / (np.abs(g) + 1e-8), rtol=1e-12)


def test_default_rule_and_named_parameters():
    model = torch.nn.ModuleDict({"embed": torch.nn.Embedding(10, 4),
                                 "body": torch.nn.Linear(4, 4),
                                 "head": torch.nn.Linear(4, 10)})
    opt = matroot.optim.Muon(model.named_parameters(), lr=0.02, adamw_lr=1e-3)
    muon_params = {id(p) for g in opt.param_groups if g["use_muon"] for p in g["params"]}
    assert muon_params == {id(model["body"].weight)}
    assert not default_use_muon(None, (3,)) and default_use_muon(None, (3, 3))
    with pytest.raises(ValueError, match="two or more"):
        matroot.optim.Muon([{"params": [model["body"].bias], "use_muon": True}])


def _two_layer(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))


def _muon_pair(data, bfloat16_reference: bool, steps: int = 3):
    """Our Muon (the documented recipe for torch's iteration, as written: no
    polar_steps) and torch.optim.Muon from the same start."""
    ours, theirs = _two_layer(), _two_layer()
    reference = torch.optim.Muon([p for p in theirs.parameters() if p.ndim == 2], lr=0.02,
                                 weight_decay=0.1, momentum=0.95, nesterov=True,
                                 adjust_lr_fn="original")
    opt = matroot.optim.Muon([{"params": [p for p in ours.parameters() if p.ndim == 2],
                               "use_muon": True}], lr=0.02, weight_decay=0.1,
                             polar_method="quintic",
                             matmul_dtype="bfloat16" if bfloat16_reference else None)
    for _ in range(steps):
        for model, optimizer in ((ours, opt), (theirs, reference)):
            optimizer.zero_grad()
            model(data).square().mean().backward()
            for p in model.parameters():
                if p.ndim < 2:
                    p.grad = None
            optimizer.step()
    start = _two_layer()
    return [(a, b, (b - p0).norm()) for a, b, p0 in
            zip(ours.parameters(), theirs.parameters(), start.parameters()) if a.ndim == 2]


def test_torch_shell_follows_torch_optim_muon_convention(monkeypatch):
    """EMA momentum, Nesterov, sqrt(max(1, m/n)), decoupled decay, the 5-step quintic on
    a Frobenius-normalised iterate: with torch's iteration in float32 the two agree to
    float32 rounding (a few u of the movement)."""
    use_float32_iterates(monkeypatch)
    data = torch.randn(32, 12, generator=torch.Generator().manual_seed(1))
    for a, b, moved in _muon_pair(data, bfloat16_reference=False):
        assert moved > 0
        assert (a - b).norm() <= 1e-5 * moved


def test_torch_shell_near_torch_optim_muon_in_bfloat16():
    """torch.optim.Muon itself keeps bfloat16 iterates (ours: float32 iterates with
    bfloat16 operands): one orthogonalization differs by 1-2 % (a few units of
    bfloat16's 2⁻⁸ through five steps), three steps of momentum by under 10 %."""
    data = torch.randn(32, 12, generator=torch.Generator().manual_seed(1))
    for a, b, moved in _muon_pair(data, bfloat16_reference=True):
        assert (a - b).norm() <= 0.1 * moved


def _train(opt_factory, steps, model_seed=0):
    model = _two_layer(model_seed)
    opt = opt_factory(model)
    gen = torch.Generator().manual_seed(7)
    for _ in range(steps):
        x = torch.randn(16, 12, generator=gen)

        def closure(x=x):
            opt.zero_grad()
            loss = (model(x) - x[:, :8]).square().mean()
            loss.backward()
            return loss

        loss = opt.step(closure)
    return model, opt, loss


def test_default_muon_decreases_the_loss_on_a_tiny_regression():
    x = torch.randn(64, 12, generator=torch.Generator().manual_seed(3))

    @torch.no_grad()
    def held_out_loss(model):
        return float((model(x) - x[:, :8]).square().mean())

    before = held_out_loss(_two_layer())
    trained, _, _ = _train(lambda m: matroot.optim.Muon(m.parameters(), lr=0.02,
                                                        adamw_lr=1e-3), 40)
    after = held_out_loss(trained)
    assert after < 0.5 * before, (before, after)


def test_resume_is_bit_identical():
    def factory(model):
        return matroot.optim.Muon(model.parameters(), lr=0.02, adamw_lr=1e-3, weight_decay=0.01)

    full, _, _ = _train(factory, 6)
    half, opt, _ = _train(factory, 3)
    saved_model = {k: v.clone() for k, v in half.state_dict().items()}
    saved_opt = opt.state_dict()
    resumed = _two_layer()
    resumed.load_state_dict(saved_model)
    opt2 = factory(resumed)
    opt2.load_state_dict(saved_opt)
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):  # skip the batches already seen
        torch.randn(16, 12, generator=gen)
    for _ in range(3):
        x = torch.randn(16, 12, generator=gen)
        opt2.zero_grad()
        (resumed(x) - x[:, :8]).square().mean().backward()
        opt2.step()
    # Same program, same inputs, same thread count: the same bits.
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_a_group_added_later_is_split_by_the_rule():
    model = _two_layer()
    layers = list(model.children())
    opt = matroot.optim.Muon(layers[0].parameters(), lr=0.02, adamw_lr=1e-3)
    opt.add_param_group({"params": list(layers[2].parameters())})
    assert [g["use_muon"] for g in opt.param_groups] == [True, False, True, False]
    assert [g["lr"] for g in opt.param_groups] == [0.02, 1e-3, 0.02, 1e-3]
    model(torch.ones(2, 12)).sum().backward()
    opt.step()


def test_scheduler_and_closure():
    model = _two_layer()
    opt = matroot.optim.Muon(model.parameters(), lr=0.02, adamw_lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loss = opt.step(lambda: model(torch.ones(2, 12)).sum())
    assert loss is not None
    scheduler.step()
    assert [g["lr"] for g in opt.param_groups] == [0.01, 5e-4]


def test_optax_shell_matches_the_core():
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    from matroot.optim.optax import muon

    rng = np.random.default_rng(2)
    params = {"a": rng.standard_normal((6, 4)).astype(np.float32),
              "b": rng.standard_normal((6, 4)).astype(np.float32),
              "bias": rng.standard_normal(4).astype(np.float32)}
    grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}
    opt = muon(0.1, adamw_lr_ratio=0.5)
    state = opt.init(jax.tree_util.tree_map(jax.numpy.asarray, params))
    update = jax.jit(opt.update)
    for _ in range(2):
        updates, state = update(jax.tree_util.tree_map(jax.numpy.asarray, grads), state)
    leaves = [grads["a"], grads["b"], grads["bias"]]
    core_state = muon_init(leaves, [True, True, False])
    for _ in range(2):
        directions, core_state = muon_directions(leaves, core_state, [True, True, False],
                                                 MuonConfig())
    for key, d, scale in zip(("a", "b", "bias"), directions, (1.0, 1.0, 0.5)):
        np.testing.assert_allclose(np.asarray(updates[key]), -0.1 * scale * d,
                                   rtol=2e-4, atol=2e-5)
    assert isinstance(optax.apply_updates(params, updates)["a"], jax.Array)


def test_muon_reaches_adamw_final_loss_in_fewer_steps_on_digits():
    """sklearn's bundled digits, a 64-128-128-10 MLP, batches of 128, full-train loss
    after every step; each optimizer's best learning rate from a small grid."""
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    steps = 150

    def curve(factory):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10))
        opt = factory(model)
        gen = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(steps):
            batch = torch.randint(0, len(y), (128,), generator=gen)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
            with torch.no_grad():
                losses.append(torch.nn.functional.cross_entropy(model(x), y).item())
        return np.array(losses)

    adamw = min((curve(lambda m, lr=lr: torch.optim.AdamW(m.parameters(), lr=lr))
                 for lr in (3e-3, 1e-2, 3e-2)), key=lambda c: c[-1])
    muon = min((curve(lambda m, lr=lr: matroot.optim.Muon(m.parameters(), lr=lr,
                                                          adamw_lr=3e-3))
                for lr in (0.02, 0.05)), key=lambda c: c[-1])
    reached = np.nonzero(muon <= adamw[-1])[0]
    assert reached.size and reached[0] + 1 < steps, (adamw[-1], muon[-1])


def test_muon_vs_adamw_example_quick_run_writes_its_table(tmp_path, monkeypatch):
    """examples/muon_vs_adamw.py (the committed comparison) in its smoke setting."""
    import json
    import pathlib
    import sys

    pytest.importorskip("sklearn")
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parents[2] / "examples"))
    sys.modules.pop("muon_vs_adamw", None)
    import muon_vs_adamw

    assert muon_vs_adamw.main(["--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "muon_vs_adamw.json").read_text())
    for task in report["tasks"].values():
        assert set(task["results"]) == {"AdamW", "Muon", "Muon (quintic)"}
        assert all(np.isfinite(r["final_loss"]) for r in task["results"].values())
    assert (tmp_path / "muon_vs_adamw.md").read_text().startswith("| task |")
