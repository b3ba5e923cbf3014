"""SOAP's ``grafting`` option: the stacked core against the per-parameter float64
reference (tests/soap_reference.py) for every choice, sgd's block norms, "none" as
before, the torch shell (its jitted optax twin: test_soap_optax.py), the option's
validation and the migration message, and the grafting moments through checkpoints
(whole and sharded records)."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest

from matroot.optim.soap import SOAPConfig, init, state_bytes, update
from soap_reference import ReferenceSOAP
from test_soap_core import OPTIONS, TIGHT, _grads, _problem, _run

CHOICES = ["sgd", "adam", "rmsprop", "adagrad"]


def _compare(options, steps=9, missing=None):
    """test_soap_core's run against the reference, asserted at every step."""
    for params, ref_params, state in _run(steps, options, missing=missing):  # noqa: B007
        for p, r in zip(params, ref_params):
            np.testing.assert_allclose(p, r, rtol=1e-9, atol=1e-9)
    return state


@pytest.mark.parametrize("grafting", CHOICES)
@pytest.mark.parametrize("bias_correction", [True, False])
def test_stacked_core_matches_the_reference(grafting, bias_correction):
    """Step 1 takes the grafting direction itself (before start_preconditioning_step=2),
    then the SOAP direction grafted, through four refreshes."""
    state = _compare(dict(OPTIONS, grafting=grafting, bias_correction=bias_correction))
    assert state.refreshes == 4
    kept = [a is not None for a in state.block_graft_exp_avg + state.graft_exp_avg]
    assert any(kept) == (grafting != "sgd")


def test_grafting_hyperparameters_and_missing_gradients_match_the_reference():
    options = dict(OPTIONS, grafting="adam", grafting_beta2=0.99, grafting_eps=1e-3,
                   start_preconditioning_step=3)
    _compare(options, missing={3: (1,), 4: (1, 2), 5: (4,)})


def test_grafting_none_is_the_default_and_keeps_no_state():
    params, targets, rng = _problem()
    grads = _grads(params, targets, rng)
    plain, explicit = SOAPConfig(**OPTIONS), SOAPConfig(**OPTIONS, grafting="none")
    assert plain == explicit and plain.grafting_method is None
    a, b = init(params, plain), init(params, explicit)
    for _ in range(3):
        ua, a = update(grads, a, params, plain)
        ub, b = update(grads, b, params, explicit)
        for x, y in zip(ua, ub):
            np.testing.assert_array_equal(x, y)
    assert all(m is None for m in a.graft_exp_avg + a.block_graft_exp_avg)
    with_adam = init(params, SOAPConfig(**OPTIONS, grafting="adam"))
    grown = state_bytes(with_adam)["moments"] - state_bytes(a)["moments"]
    assert grown == 2 * 8 * sum(p.size for p in params)   # one float64 pair per element


def test_sgd_block_norms_are_the_gradient_norms():
    """With β₁ = 0 and no weight decay, sgd grafting's m̂ is the gradient: each block's
    step (each unfactored parameter's) has the gradient block's Frobenius norm times lr."""
    shapes = [(8, 6), (6, 6), (5,)]
    options = dict(OPTIONS, betas=(0.0, 0.95), weight_decay=0.0, grafting="sgd",
                   start_preconditioning_step=1)
    config = SOAPConfig(**options, **TIGHT)
    params, targets, rng = _problem(1, shapes)
    state = init(params, config)
    for _ in range(5):
        grads = _grads(params, targets, rng)
        updates, state = update(grads, state, params, config)
        for u, g in zip(updates, grads):
            if g.ndim == 1:
                np.testing.assert_allclose(np.linalg.norm(u), 0.05 * np.linalg.norm(g),
                                           rtol=1e-12)
                continue
            for r in range(0, g.shape[0], 4):
                for c in range(0, g.shape[1], 4):
                    np.testing.assert_allclose(np.linalg.norm(u[r:r + 4, c:c + 4]),
                                               0.05 * np.linalg.norm(g[r:r + 4, c:c + 4]),
                                               rtol=1e-12)
        params = [p + u for p, u in zip(params, updates)]
    assert state.refreshes == 3


def test_bad_grafting_values_name_the_choices():
    with pytest.raises(ValueError, match=r"grafting='momentum' is not one of 'none', 'adam'"):
        SOAPConfig(grafting="momentum")
    with pytest.raises(ValueError, match="grafting_beta2"):
        SOAPConfig(grafting="adam", grafting_beta2=1.5)
    with pytest.raises(ValueError, match="grafting_eps"):
        SOAPConfig(grafting="adam", grafting_eps=-1.0)
    from matroot.optim.soap import soap
    with pytest.raises(TypeError, match=r"grafting_config.*grafting='adam'.*grafting_beta2="):
        soap(grafting_config=None)


def test_a_state_made_for_another_grafting_is_refused():
    params, targets, rng = _problem()
    state = init(params, SOAPConfig(**OPTIONS))
    with pytest.raises(ValueError, match="another grafting than grafting='adam'"):
        update(_grads(params, targets, rng), state, params, SOAPConfig(**OPTIONS, grafting="adam"))


def test_nonfinite_skip_keeps_the_grafting_moments():
    params, targets, rng = _problem()
    config = SOAPConfig(**OPTIONS, grafting="adam", nonfinite_grads="skip")
    _, state = update(_grads(params, targets, rng), init(params, config), params, config)
    before = [np.copy(a) for a in state.block_graft_exp_avg]
    grads = _grads(params, targets, rng)
    grads[2] = np.full(grads[2].shape, np.nan)
    updates, state = update(grads, state, params, config)
    assert state.skipped_steps == 1 and all(not np.any(u) for u in updates)
    for a, b in zip(before, state.block_graft_exp_avg):
        np.testing.assert_array_equal(a, b)


# --- the shells --------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("grafting", ["sgd", "adam"])
def test_torch_shell_matches_the_reference(grafting):
    torch = _torch()
    from matroot.optim import SOAP
    options = dict(OPTIONS, grafting=grafting)
    params, targets, rng = _problem(2)
    tensors = [torch.tensor(p, requires_grad=True) for p in params]
    opt = SOAP(tensors, **TIGHT, **options)
    ref = ReferenceSOAP(params, **options)
    ref_params = [p.copy() for p in params]
    for _ in range(6):
        grads = _grads(ref_params, targets, rng)
        for t, g in zip(tensors, grads):
            t.grad = torch.tensor(g)
        opt.step()
        ref_params = ref.step(ref_params, grads)
        for t, r in zip(tensors, ref_params):
            np.testing.assert_allclose(t.detach().numpy(), r, rtol=1e-9, atol=1e-9)


def test_torch_state_dict_round_trip_with_adam_grafting():
    torch = _torch()
    from matroot.optim import SOAP

    def model(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))

    def train(net, opt, steps, seed):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x = torch.randn(16, 6, generator=gen)
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()

    settings = dict(lr=1e-2, precondition_frequency=2, grafting="adam", block_size=4)
    net = model(0)
    opt = SOAP(net.parameters(), **settings)
    train(net, opt, 3, seed=1)
    saved = opt.state_dict()
    family = saved["soap_families"][0]
    assert any(a is not None for a in family["block_graft_exp_avg"])
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": saved}, buffer)
    train(net, opt, 4, seed=2)

    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    twin = model(9)
    twin.load_state_dict(loaded["model"])
    twin_opt = SOAP(twin.parameters(), **settings)
    twin_opt.load_state_dict(loaded["opt"])
    train(twin, twin_opt, 4, seed=2)
    for a, b in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    # The saved groups' grafting wins, as every saved hyperparameter does in torch.
    plain = SOAP(model(0).parameters(), lr=1e-2, precondition_frequency=2, block_size=4)
    plain.load_state_dict(copy.deepcopy(saved))
    assert plain.param_groups[0]["grafting"] == "adam"
    names = ("graft_exp_avg", "graft_exp_avg_sq", "block_graft_exp_avg",
             "block_graft_exp_avg_sq")
    lost = copy.deepcopy(saved)         # grafting moments missing for grafting="adam"
    for entry in lost["soap_families"]:
        for name in names:
            del entry[name]
    with pytest.raises(ValueError, match="another grafting than 'adam'"):
        SOAP(model(0).parameters(), **settings).load_state_dict(lost)
    # A state dict from before grafting existed: no grafting keys anywhere; it loads
    # as grafting="none" and trains on.
    for group in lost["param_groups"]:
        for name in ("grafting", "grafting_beta2", "grafting_eps"):
            del group[name]
    old_net = model(0)
    old_opt = SOAP(old_net.parameters(), **settings)
    old_opt.load_state_dict(lost)
    assert old_opt.param_groups[0]["grafting"] == "none"
    train(old_net, old_opt, 2, seed=3)


def test_grafting_with_moments_cannot_be_switched_on_mid_run():
    torch = _torch()
    from matroot.optim import SOAP
    w = torch.nn.Parameter(torch.randn(4, 3))
    opt = SOAP([w], lr=1e-2)
    w.grad = torch.randn(4, 3)
    opt.step()
    opt.param_groups[0]["grafting"] = "adam"
    with pytest.raises(ValueError, match=r"grafting \(to or from one with moments\) changed"):
        opt.step()


def test_sharded_records_cut_and_merge_with_grafting_moments():
    """A single-process record cut for 2 and 3 ranks and merged back is the record
    (grafting moments included), without and with them."""
    torch = _torch()
    from matroot.optim import SOAP
    from matroot.optim.distributed.soap_checkpoint import cut_family, merge_family
    from matroot.optim.soap import make_plan
    for grafting in ("none", "adam"):
        params = [torch.nn.Parameter(torch.randn(s)) for s in [(8, 6), (8, 6), (6,), (9, 4)]]
        opt = SOAP(params, lr=1e-2, block_size=4, precondition_frequency=2, grafting=grafting)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape)
            opt.step()
        entry = opt.state_dict()["soap_families"][0]
        plan = make_plan(params, SOAPConfig(block_size=4, grafting=grafting))
        for world in (2, 3):
            merged = merge_family([cut_family(entry, plan, world, r) for r in range(world)],
                                  plan)
            for name in ("graft_exp_avg", "block_graft_exp_avg_sq", "block_exp_avg", "bases"):
                assert len(merged[name]) == len(entry[name])
                for a, b in zip(merged[name], entry[name]):
                    assert (a is None) == (b is None)
                    if a is not None:
                        torch.testing.assert_close(a, b, rtol=0, atol=0)
        kept = any(a is not None for a in entry["block_graft_exp_avg"])
        assert kept == (grafting == "adam")
