"""torch's generic optimizer checks (test/test_optim.py's OptimizerInfo suite), re-expressed
against ``matroot.optim.Shampoo``: state dicts with hooks, groups added later or not
matching, deepcopy and pickle (of SOAP and Muon too), closures, LR schedulers,
``zero_grad`` and steps without gradients.

Where two optimizers are compared bit for bit they run the same program on the same
inputs (a copy against its original), which is deterministic on one CPU thread pool.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from matroot.optim import SOAP, Muon, Shampoo

OPTIONS = dict(lr=0.05, block_size=4, precondition_frequency=2, start_preconditioning_step=2,
               weight_decay=0.01)


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen))
            for shape in ((6, 5), (5,), (3, 4))]


def _grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = 0.3 * p.detach() ** 3 + torch.randn(p.shape, generator=gen)


def _train(opt, params, steps, start=0):
    for step in range(start, start + steps):
        _grads(params, step)
        opt.step()


def _same(a, b) -> bool:
    return all(torch.equal(x.detach(), y.detach()) for x, y in zip(a, b))


def _trained(steps=3):
    params = _params()
    opt = Shampoo(params, **OPTIONS)
    _train(opt, params, steps)
    return opt, params


def _copied(thing, how):
    """``thing`` copied as users copy an optimizer: deepcopy, pickle or torch.save/load."""
    if how == "deepcopy":
        return copy.deepcopy(thing)
    if how == "pickle":
        return pickle.loads(pickle.dumps(thing))
    buffer = io.BytesIO()
    torch.save(thing, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_copied_optimizer_continues_like_the_original(how):
    opt, params = _trained()
    opt2 = _copied(opt, how)
    params2 = [p for g in opt2.param_groups for p in g["params"]]
    assert all(p is not q for p, q in zip(params, params2))
    assert _same(params, params2)
    _train(opt, params, 3, start=3)
    _train(opt2, params2, 3, start=3)
    assert _same(params, params2)
    assert opt2.diagnostics()["root_refreshes"] == opt.diagnostics()["root_refreshes"] == 3
    # The copy owns its state: the original's stacks were not shared.
    assert opt._families[0].state.factors[0] is not opt2._families[0].state.factors[0]


def _soap_or_muon(name, params):
    if name == "SOAP":
        return SOAP(params, lr=0.05, block_size=4, precondition_frequency=2)
    return Muon([{"params": [params[0], params[2]], "use_muon": True},
                 {"params": [params[1]], "use_muon": False}], nonfinite_grads="skip")


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
@pytest.mark.parametrize("name", ["SOAP", "Muon"])
def test_soap_and_muon_copies_continue_like_the_original(name, how):
    """torch's ``__getstate__`` keeps ``defaults``, ``state`` and ``param_groups`` only:
    a copied SOAP lost its families and a copied Muon its config, and either raised
    AttributeError at its next step. Copied with the model's parameters (as
    ``copy.deepcopy({"model": ..., "opt": ...})`` does), a copy follows the original."""
    params = _params()
    opt = _soap_or_muon(name, params)
    _train(opt, params, 3)
    copied = _copied({"params": params, "opt": opt}, how)
    params2, opt2 = copied["params"], copied["opt"]
    assert all(p is not q for p, q in zip(params, params2)) and _same(params, params2)
    _train(opt, params, 3, start=3)
    _train(opt2, params2, 3, start=3)
    assert _same(params, params2)
    if name == "SOAP":
        assert opt2.diagnostics() == opt.diagnostics()
        assert opt2._families[0].state.factors[0] is not opt._families[0].state.factors[0]
    else:
        assert opt2.config == opt.config and opt2.skipped_steps == opt.skipped_steps


@pytest.mark.parametrize("name", ["SOAP", "Muon"])
def test_repr_lists_every_group_as_torch_does(name):
    """``print(opt)`` showed SOAP's first group's config only and none of Muon's
    learning rates; it is torch's listing now, with the values a scheduler set."""
    params = _params()
    groups = [{"params": params[:2], "lr": 0.05}, {"params": params[2:], "lr": 0.05}]
    opt = SOAP(groups) if name == "SOAP" else Muon(
        [{**group, "use_muon": p.ndim == 2} for group, p in zip(groups, (params[1], params[2]))])
    opt.param_groups[1]["lr"] = 0.125
    text = repr(opt)
    assert text.startswith(f"{name} (") and "Parameter Group 1" in text
    assert "lr: 0.05" in text and "lr: 0.125" in text


def test_muon_keeps_the_names_of_named_parameters_as_torch_does():
    """torch's optimizers keep ``named_parameters()``'s names in each group's
    ``param_names`` (and state dict); Muon kept them in ``use_muon`` groups but dropped
    them from the groups its rule splits."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    opt = Muon(model.named_parameters())
    names = {n for g in opt.param_groups for n in g["param_names"]}
    assert names == {n for n, _ in model.named_parameters()}
    for group in opt.param_groups:
        assert len(group["param_names"]) == len(group["params"])
    assert all("param_names" in g for g in opt.state_dict()["param_groups"])


def test_a_fresh_optimizer_deep_copies_too():
    params = _params()
    opt2 = copy.deepcopy(Shampoo(params, **OPTIONS))
    params2 = opt2.param_groups[0]["params"]
    _train(opt2, params2, 2)
    assert opt2.diagnostics()["steps"] == 2


def _state_dict_pre_hook(optimizer):
    optimizer.state["test"] = 1


def _state_dict_post_hook(optimizer, state_dict):
    state_dict["ran_state_dict_pre_hook"] = state_dict["state"].pop("test", None) == 1
    return state_dict


def _load_pre_hook_lr(optimizer, state_dict):
    state_dict["param_groups"][0]["lr"] = 0.002


def _load_pre_hook_copy(optimizer, state_dict):
    # A hook may return a new dict (a deep copy here): that one must be loaded.
    mine = copy.deepcopy(state_dict)
    mine["param_groups"][0]["lr"] = 0.003
    return mine


def _load_post_hook(optimizer):
    optimizer.state["ran_load_state_dict_pre_hook2"] = optimizer.param_groups[0]["lr"] == 0.003
    optimizer.state["ran_load_state_dict_post_hook"] = True


def test_state_dict_hooks_run_and_their_writes_stay():
    opt, params = _trained()
    opt.register_state_dict_pre_hook(_state_dict_pre_hook)
    opt.register_state_dict_post_hook(_state_dict_post_hook)
    sd = opt.state_dict()
    assert sd["ran_state_dict_pre_hook"] and "test" not in sd["state"]

    opt2 = Shampoo(_params(), **OPTIONS)
    opt2.register_load_state_dict_pre_hook(_load_pre_hook_lr)
    opt2.register_load_state_dict_pre_hook(_load_pre_hook_copy)
    opt2.register_load_state_dict_post_hook(_load_post_hook)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == 0.003
    assert opt2.state["ran_load_state_dict_pre_hook2"] is True
    assert opt2.state["ran_load_state_dict_post_hook"] is True
    # ... and the loaded Shampoo state is complete.
    assert opt2.diagnostics()["steps"] == 3 and len(opt2._families) == 1


def test_a_state_key_that_is_not_a_parameter_is_kept_like_torch_keeps_it():
    opt, params = _trained()
    opt.state["note"] = {"epoch": 4}
    sd = opt.state_dict()
    assert sd["state"]["note"] == {"epoch": 4}
    opt2 = Shampoo(_params(), **OPTIONS)
    opt2.load_state_dict(sd)
    assert opt2.state["note"] == {"epoch": 4}
    params2 = opt2.param_groups[0]["params"]
    for p, q in zip(params, params2):
        q.data.copy_(p.detach())
    _train(opt, params, 2, start=3)
    _train(opt2, params2, 2, start=3)
    assert _same(params, params2)


def test_load_state_dict_round_trip_continues_bit_for_bit():
    opt, params = _trained()
    sd = copy.deepcopy(opt.state_dict())
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = Shampoo(params2, **OPTIONS)
    opt2.load_state_dict(sd)
    assert opt2.state_dict()["shampoo_families"][0]["step"] == 3
    _train(opt, params, 3, start=3)
    _train(opt2, params2, 3, start=3)
    assert _same(params, params2)


@pytest.mark.parametrize("trained", [False, True])
def test_mismatched_parameter_groups_are_refused_like_torch(trained):
    params = _params()
    two = Shampoo([{"params": params[:2]}, {"params": params[2:]}], **OPTIONS)
    if trained:
        _train(two, params, 2)
    sd = two.state_dict()
    one = Shampoo(_params(), **OPTIONS)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        one.load_state_dict(sd)
    three = Shampoo([{"params": [p]} for p in _params()], **OPTIONS)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        three.load_state_dict(sd)
    uneven = Shampoo([{"params": _params()[:1]}, {"params": _params()[1:]}], **OPTIONS)
    with pytest.raises(ValueError, match="doesn't match the size"):
        uneven.load_state_dict(sd)


def test_a_group_added_after_training_started_gets_its_own_state():
    params = _params()
    opt = Shampoo(params[:2], **OPTIONS)
    _train(opt, params[:2], 2)
    opt.add_param_group({"params": [params[2]], "lr": 0.01})
    before = params[2].detach().clone()
    _train(opt, params, 2, start=2)
    assert not torch.equal(params[2].detach(), before)
    assert len(opt._families) == 2
    assert int(opt.state[params[2]]["step"]) == 2 and int(opt.state[params[0]]["step"]) == 4
    # It round-trips through a state dict like the rest.
    sd = opt.state_dict()
    again = _params()
    opt2 = Shampoo(again[:2], **OPTIONS)
    opt2.add_param_group({"params": [again[2]], "lr": 0.01})
    opt2.load_state_dict(sd)
    assert len(opt2._families) == 2


def test_closure_is_evaluated_with_gradients_and_its_loss_returned():
    params = _params()
    opt = Shampoo(params, **OPTIONS)
    calls = []

    def closure():
        opt.zero_grad()
        loss = sum((p ** 2).sum() for p in params)
        loss.backward()
        calls.append(torch.is_grad_enabled())
        return loss

    before = [p.detach().clone() for p in params]
    loss = opt.step(closure)
    assert calls == [True] and torch.is_tensor(loss)
    assert not _same(params, before)


def test_lr_scheduler_sets_the_step_size():
    params = _params()
    opt = Shampoo(params, **dict(OPTIONS, weight_decay=0.0))
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.0)
    _train(opt, params, 1)
    scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.0
    before = [p.detach().clone() for p in params]
    _train(opt, params, 2, start=1)          # lr 0: the state advances, the weights do not
    assert _same(params, before) and opt.diagnostics()["steps"] == 3
    assert scheduler.state_dict()["last_epoch"] == 1


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none):
    opt, params = _trained(1)
    opt.zero_grad(set_to_none=set_to_none)
    for p in params:
        if set_to_none:
            assert p.grad is None
        else:
            assert torch.count_nonzero(p.grad) == 0


def test_steps_without_gradients_change_nothing():
    opt, params = _trained(2)
    opt.zero_grad()
    before = [p.detach().clone() for p in params]
    sd = copy.deepcopy(opt.state_dict())
    assert opt.step() is None
    assert _same(params, before)
    assert opt.state_dict()["shampoo_families"][0]["step"] == sd["shampoo_families"][0]["step"]
    # A parameter without a gradient keeps its value while the others move.
    _grads(params, 5)
    params[1].grad = None
    opt.step()
    assert torch.equal(params[1].detach(), before[1])
    assert not torch.equal(params[0].detach(), before[0])


def test_a_fresh_optimizer_without_gradients_has_no_state():
    params = _params()
    opt = Shampoo(params, **OPTIONS)
    opt.step()
    assert len(opt.state) == 0 and opt.diagnostics()["steps"] == 0


def test_muon_mixes_named_and_unnamed_groups_and_adds_unnamed_ones_later():
    """torch refuses a group without names beside named ones; keeping the names must
    not make Muon refuse what it took before: named and unnamed groups together, or a
    layer unfrozen by ``add_param_group({"params": layer.parameters()})`` after
    ``Muon(model.named_parameters())``. The names then go from every group."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    extra = torch.nn.Linear(3, 3)
    mixed = Muon([{"params": list(model.named_parameters())},
                  {"params": list(extra.parameters()), "use_muon": False}])
    assert not any("param_names" in g for g in mixed.param_groups)
    opt = Muon(model.named_parameters())
    opt.add_param_group({"params": list(extra.parameters()), "use_muon": False})
    assert not any("param_names" in g for g in opt.param_groups)
    opt.add_param_group({"params": [("late", torch.nn.Parameter(torch.ones(2, 2)))],
                         "use_muon": True})
    assert len(opt.param_groups) == 4 and not any("param_names" in g for g in opt.param_groups)
