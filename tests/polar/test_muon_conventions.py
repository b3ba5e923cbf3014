"""Muon's torch shell as other people's training scripts use them (written for AdamW,
torch.optim.Muon or MuonWithAuxAdam): its groups, option names, checkpoints, lazy
modules and compiled steps. Each test is a finding (a crash with an unclear error, a
silently wrong update, a broken torch.optim convention) and fails without its fix. The
optax shells: ``optim/test_optax_conventions.py``."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")
from torch_muon_reference import use_float32_iterates  # noqa: E402

from matroot.optim import Muon  # noqa: E402


def test_muon_names_sparse_gradients_and_complex_parameters():
    """A sparse embedding gradient failed inside the moment update with torch's
    "add(sparse, dense) is not supported"; a complex matrix failed in the polar
    solver with a message about casting integers."""
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    opt = Muon(embedding.parameters())
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(TypeError, match="sparse gradients"):
        opt.step()
    with pytest.raises(TypeError, match=r"real floating parameters, got dtype torch\.complex64"):
        Muon([torch.nn.Parameter(torch.ones(4, 4, dtype=torch.complex64))])


def test_muon_groups_carry_momentum_and_betas_for_schedulers_and_per_group_settings():
    """``OneCycleLR`` (``cycle_momentum=True`` by default) raised "optimizer must
    support momentum or beta1", and a group's ``momentum`` / ``betas`` were silently
    ignored (the optimizer-wide value was used)."""
    torch.manual_seed(0)
    muon_weight = torch.nn.Parameter(torch.randn(6, 4))
    adamw_bias = torch.nn.Parameter(torch.randn(4))
    opt = Muon([{"params": [muon_weight], "momentum": 0.5},
                {"params": [adamw_bias], "betas": (0.0, 0.5)}])
    grads = [torch.randn(6, 4), torch.randn(4)]
    muon_weight.grad, adamw_bias.grad = grads
    opt.step()
    # The buffers after one step: (1 − μ)·g for Muon, (1 − β₁)·g for AdamW.
    torch.testing.assert_close(opt.state[muon_weight]["momentum_buffer"], 0.5 * grads[0])
    torch.testing.assert_close(opt.state[adamw_bias]["momentum_buffer"], grads[1])
    scheduler = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.02, total_steps=10,
                                                    base_momentum=0.85, max_momentum=0.95)
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.95)
    opt.step()
    scheduler.step()
    assert opt.param_groups[0]["momentum"] < 0.95


def test_muon_use_muon_groups_take_named_parameters():
    """``{"params": model.named_parameters(), "use_muon": True}`` (names, as for the
    split groups) raised "needs tensors of two or more dimensions" for 2-D weights."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = Muon([{"params": [(n, p) for n, p in model.named_parameters() if p.ndim == 2],
                 "use_muon": True},
                {"params": [(n, p) for n, p in model.named_parameters() if p.ndim == 1],
                 "use_muon": False}])
    model(torch.ones(3, 4)).sum().backward()
    before = model[0].weight.detach().clone()
    opt.step()
    assert not torch.equal(model[0].weight, before)
    assert opt.param_groups[0]["param_names"] == ["0.weight", "1.weight"]
    with pytest.raises(ValueError, match=r"got 0\.bias of shape \(8,\)"):
        Muon([{"params": list(model.named_parameters()), "use_muon": True}])


def test_muon_takes_a_group_of_one_tensor_as_torch_optimizers_do():
    """``{"params": weight}`` (torch's optimizers wrap a lone tensor) was iterated into
    its rows: "can't optimize a non-leaf Tensor"; ``Muon(weight)`` the same."""
    weight = torch.nn.Parameter(torch.randn(6, 4))
    opt = Muon([{"params": weight, "lr": 0.01}])
    assert [len(g["params"]) for g in opt.param_groups] == [1]
    weight.grad = torch.randn(6, 4)
    opt.step()
    with pytest.raises(TypeError, match=r"pass \[tensor\]"):
        Muon(weight)


def test_muon_rule_sends_gpt2_style_embeddings_to_adamw():
    """nanoGPT's and Hugging Face GPT-2's ``transformer.wte`` / ``wpe`` tables (and
    ``tok_embeddings``, flax's ``Embed_0``) were matrices to the rule, so
    ``Muon(model.named_parameters())`` orthogonalized a 50k-row embedding silently."""
    from matroot.optim.muon.core import default_use_muon

    embeddings = ["transformer.wte.weight", "transformer.wpe.weight", "tok_embeddings.weight",
                  "params/Embed_0/embedding"]
    assert not any(default_use_muon(name, (100, 8)) for name in embeddings)
    assert default_use_muon("transformer.h.0.attn.c_attn.weight", (8, 24))


def test_muon_rule_knows_mingpt_and_llama_names():
    """minGPT's ``tok_emb`` (no "embed" in it) and Meta Llama's / torchtitan's top-level
    ``output`` head went to Muon; BERT's hidden ``attention.output.dense`` stays there."""
    from matroot.optim.muon.core import default_use_muon

    for name in ("tok_emb.weight", "pos_emb", "output.weight", "model.emb.weight"):
        assert not default_use_muon(name, (100, 8)), name
    for name in ("bert.encoder.layer.0.attention.output.dense.weight",
                 "layers.0.attention.wo.weight", "layers.0.feed_forward.w1.weight"):
        assert default_use_muon(name, (8, 8)), name


def test_muon_steps_past_an_empty_matrix():
    """A zero-width layer (shape (4, 0) or (0, 4)) made the polar solver divide by
    zero (ZeroDivisionError) and the whole step fail."""
    empties = [torch.nn.Parameter(torch.ones(4, 0)), torch.nn.Parameter(torch.ones(0, 4))]
    weight = torch.nn.Parameter(torch.randn(3, 3))
    opt = Muon([*empties, weight])
    for p in (*empties, weight):
        p.grad = torch.ones_like(p)
    before = weight.detach().clone()
    opt.step()
    assert not torch.equal(weight, before) and bool(weight.isfinite().all())


def test_muon_says_to_initialise_lazy_modules_first():
    """Lazy modules' parameters have no shape until a forward pass; Muon's split by
    shape failed with torch's "Can't access the shape of an uninitialized parameter"
    (which speaks of load_state_dict)."""
    model = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.LazyLinear(2))
    with pytest.raises(ValueError, match="forward pass to initialise lazy modules"):
        Muon(model.parameters())
    model(torch.ones(1, 5))
    Muon(model.parameters())


@pytest.mark.compile
def test_compiled_muon_step_does_not_recompile_when_a_scheduler_changes_lr():
    """``torch.compile(opt.step)`` with ``OneCycleLR``: Muon read ``lr`` and
    ``momentum`` from the groups inside the graph and passed ``lr`` as ``mul_`` /
    ``add_`` scalars, which torch.compile guards on, so every step recompiled until
    the recompile limit sent the step back to eager."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    opt = Muon(model.named_parameters())
    scheduler = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.02, 1e-3], total_steps=20)
    step = torch.compile(opt.step)
    # Steps 1-3 compile (each shape, then lr, step counts and μ made dynamic).
    for k in range(8):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch._dynamo.config.patch(error_on_recompile=k >= 3):
            step()
        scheduler.step()
    assert opt.param_groups[0]["momentum"] < 0.95       # μ cycled too


def _train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randn(8, 6, generator=g).to(dtype)
        model(x).float().square().mean().backward()
        opt.step()


def _through_torch_save(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _two_layers():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _one_step(model, opt):
    opt.zero_grad()
    model(torch.ones(4, 6)).square().mean().backward()
    opt.step()


def _two_layers_without_bias():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8, bias=False),
                               torch.nn.Linear(8, 3, bias=False))


def test_muon_group_lr_without_use_muon_is_refused_where_adamw_would_take_it():
    """``Muon([{"params": model.parameters(), "lr": 0.05}], adamw_lr=1e-3)`` gave the
    biases (AdamW) lr 0.05, not adamw_lr: the group's lr reached both halves. A script
    for AdamW means it for every parameter, one for torch.optim.Muon for the matrices;
    matroot now asks which."""
    model = _two_layers()
    with pytest.raises(ValueError, match=r"sets 'lr'.*0\.bias of shape \(5,\).*'adamw_lr'"):
        Muon([{"params": list(model.named_parameters()), "lr": 0.05}], adamw_lr=1e-3)
    with pytest.raises(ValueError, match="'adamw_weight_decay'"):
        Muon([{"params": model.parameters(), "weight_decay": 0.1}])
    opt = Muon([{"params": model.parameters(), "lr": 0.05, "adamw_lr": 2e-3}], adamw_lr=1e-3)
    assert [(g["use_muon"], g["lr"]) for g in opt.param_groups] == [(True, 0.05), (False, 2e-3)]
    assert not any("adamw_lr" in g for g in opt.param_groups)


def test_muon_group_keys_follow_the_constructor_and_torch_muon_groups_carry_over():
    """A group of matrices only (torch.optim.Muon's groups) keeps its lr; a group with
    use_muon (MuonWithAuxAdam's) is one half and may not set the adamw_ keys; the same
    rule holds for add_param_group."""
    model = _two_layers()
    weights = [model[0].weight, model[2].weight]
    opt = Muon([{"params": weights, "lr": 0.05, "weight_decay": 0.1}], adamw_lr=1e-3)
    assert [(g["use_muon"], g["lr"], g["weight_decay"]) for g in opt.param_groups] == \
        [(True, 0.05, 0.1)]
    opt.add_param_group({"params": [model[0].bias, model[2].bias], "betas": (0.8, 0.9)})
    assert [(g["use_muon"], g["lr"]) for g in opt.param_groups] == [(True, 0.05), (False, 1e-3)]
    with pytest.raises(ValueError, match="sets 'lr'"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))], "lr": 0.1})
    with pytest.raises(ValueError, match="with 'use_muon' sets 'adamw_lr'"):
        Muon([{"params": weights, "use_muon": True, "adamw_lr": 1e-3}])


def test_muon_refuses_a_checkpoint_of_a_model_whose_shapes_changed():
    """A checkpoint of a model whose layer was since resized loaded silently and the next
    step failed with "The size of tensor a (8) must match the size of tensor b (9)"."""
    old, new = torch.nn.Linear(6, 8), torch.nn.Linear(6, 9)
    opt = Muon(old.parameters(), lr=0.02)
    old(torch.ones(2, 6)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match=r"'momentum_buffer' of parameter 0 has shape "
                                         r"\(8, 6\) but that parameter has \(9, 6\)"):
        Muon(new.parameters(), lr=0.02).load_state_dict(opt.state_dict())


@pytest.mark.parametrize("keyword, value, says", [
    ("ns_steps", 5, "use polar_steps"), ("adjust_lr_fn", "match_rms_adamw", "use shape_scale"),
    ("ns_coefficients", (3.4445, -4.775, 2.0315), "polar_method='quintic'"),
    ("adamw_betas", (0.9, 0.95), r"use betas=\(b1, b2\)"), ("foreach", True, "leave it out"),
    ("momentm", 0.9, "did you mean 'momentum'")])
def test_muon_names_another_muons_option_and_the_fix(keyword, value, says):
    """torch.optim.Muon's ``ns_steps``/``adjust_lr_fn``/``ns_coefficients`` (and
    MuonWithAuxAdam-style ``adamw_betas``) raised "MuonConfig.__init__() got an
    unexpected keyword argument", naming neither the optimizer nor the fix."""
    with pytest.raises(TypeError, match=f"Muon has no option '{keyword}' .*{says}"):
        Muon(torch.nn.Linear(4, 3).parameters(), lr=0.02, **{keyword: value})


def test_muon_refuses_a_set_and_non_tensors_in_a_group_as_torch_does():
    """``{"params": set(...)}`` was accepted (torch refuses it: a set's order, which the
    state dict's numbering follows, changes between runs), and
    ``Muon(dict(model.named_parameters()))`` failed with "'str' object has no attribute
    'shape'"."""
    model = _two_layers()
    with pytest.raises(TypeError, match="ordered collections"):
        Muon([{"params": set(model.parameters())}])
    with pytest.raises(TypeError, match=r"one of the params is str: pass .*named_parameters"):
        Muon(dict(model.named_parameters()))
    with pytest.raises(TypeError, match="one of the params is NoneType"):
        Muon([model[0].weight, None])


def test_muon_names_a_group_whose_use_muon_changed_after_its_first_step():
    """Flipping ``group["use_muon"]`` mid-run failed with "unsupported operand type(s)
    for *: 'float' and 'NoneType'" (a Muon parameter has no AdamW second moment). The
    error now names the change and the way to restart the parameter, which works."""
    model = _two_layers()
    opt = Muon(model.parameters(), lr=0.02)
    _one_step(model, opt)
    opt.param_groups[0]["use_muon"] = False
    with pytest.raises(ValueError, match=r"use_muon .* changed after its first step, and its "
                                         r"state is Muon's: .*del optimizer.state\[param\]"):
        _one_step(model, opt)
    for p in opt.param_groups[0]["params"]:
        del opt.state[p]
    _one_step(model, opt)
    assert all("exp_avg_sq" in opt.state[p] for p in opt.param_groups[0]["params"])


def test_muon_resumes_from_a_torch_optim_muon_checkpoint(monkeypatch):
    """A torch.optim.Muon checkpoint (its groups have no ``use_muon``, its state no
    ``step``) loaded and then failed at the next step with ``KeyError: 'use_muon'``.
    Both keep the momentum buffer in the same convention, so it carries over: with
    torch's iteration (``polar_method="quintic"``), both in float32, the next step
    matches torch.optim.Muon's to float32 rounding (a zero buffer would not)."""
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon needs torch >= 2.9")
    use_float32_iterates(monkeypatch)
    model = _two_layers_without_bias()
    theirs = torch.optim.Muon(model.parameters(), lr=0.02)
    _train(model, theirs, 2)
    checkpoint = _through_torch_save(theirs.state_dict())
    twin = _two_layers_without_bias()
    twin.load_state_dict(model.state_dict())
    ours = Muon(twin.parameters(), lr=0.02, polar_method="quintic", polar_steps=5)
    ours.load_state_dict(checkpoint)
    assert [g["use_muon"] for g in ours.param_groups] == [True]
    before = [p.detach().clone() for p in model.parameters()]
    _train(model, theirs, 1, seed=5)
    _train(twin, ours, 1, seed=5)
    for p0, p, q in zip(before, model.parameters(), twin.parameters()):
        # float32 through 5 quintic steps of a 8x6 matrix: a few hundred u of the step.
        assert (p - q).norm() <= 1e-4 * (p - p0).norm()
