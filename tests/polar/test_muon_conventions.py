"""The torch shells as other people's training scripts use them: each test is a finding
of a red-team round (a crash with an unclear error, a silently wrong update, a broken
torch.optim convention) and fails without its fix. The optax shells:
test_optim_redteam_optax.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from matroot.optim import Muon, Shampoo  # noqa: E402


def _linear_pair():
    """Two equal small models and a regression batch."""
    torch.manual_seed(0)
    first = torch.nn.Linear(6, 3)
    second = torch.nn.Linear(6, 3)
    second.load_state_dict(first.state_dict())
    return first, second, torch.randn(16, 6), torch.randn(16, 3)


def test_shampoo_takes_a_tensor_learning_rate_as_torch_optimizers_do():
    """``lr=torch.tensor(...)`` (torch's optimizers take it; compiled training scripts
    use it so a scheduler does not recompile) raised "lr must be a finite real
    number". A scheduler ``fill_``s the tensor in place; the updates equal a float lr's."""
    first, second, x, y = _linear_pair()
    optimizers = [Shampoo(first.parameters(), lr=torch.tensor(0.01), precondition_frequency=2),
                  Shampoo(second.parameters(), lr=0.01, precondition_frequency=2)]
    schedulers = [torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5) for opt in optimizers]
    for _ in range(5):
        for model, opt, scheduler in zip((first, second), optimizers, schedulers):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            scheduler.step()
    assert torch.is_tensor(optimizers[0].param_groups[0]["lr"])
    # Same program and inputs on both sides, the lr read as the same float: bitwise.
    assert torch.equal(first.weight, second.weight)


@pytest.mark.parametrize("keyword,says", [("fused", "leave it out"), ("foreach", "leave it out"),
                                          ("epsilon", "did you mean 'eps'")])
def test_shampoo_names_an_option_it_does_not_have_and_the_fix(keyword, says):
    """Scripts swap AdamW(..., fused=True) or a misspelt option for Shampoo."""
    layer = torch.nn.Linear(4, 3)
    with pytest.raises(TypeError, match=f"no option '{keyword}'.*{says}"):
        Shampoo(layer.parameters(), lr=1e-3, **{keyword: True})


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


def _ranks_with_other_models(rank, world, tmpdir):
    """Rank-side scenarios of the test below: pipeline-like stages (other shapes on
    each rank), then same shapes with per-rank values, then DDP replicas."""
    out = {}
    stages = ([torch.nn.Linear(8, 16)] if rank == 0 else
              [torch.nn.Linear(16, 4), torch.nn.Linear(4, 4)])
    torch.manual_seed(rank)
    per_rank = torch.nn.Linear(8, 4)
    torch.manual_seed(0)
    replica = torch.nn.Linear(8, 4)
    for name, modules in (("stages", stages), ("per_rank", [per_rank]),
                          ("replica", [replica])):
        params = [p for m in modules for p in m.parameters()]
        opt = Shampoo(params)
        for p in params:
            p.grad = torch.ones_like(p)
        try:
            opt.step()
            out[name] = "stepped"
        except ValueError as error:
            out[name] = str(error)
    return out


def test_sharded_shampoo_refuses_ranks_that_hold_other_models(tmp_path):
    """``distributed="auto"`` shards over every initialised process group: pipeline
    stages (other shapes per rank) crashed inside gloo (``EnforceNotMet``, a SIGABRT)
    and per-rank models silently took each other's updates."""
    from spawned_ranks import run_on_ranks

    for result in run_on_ranks(_ranks_with_other_models, 2, str(tmp_path)):
        assert "different shapes" in result["stages"]
        assert "different values" in result["per_rank"]
        assert "distributed=None" in result["per_rank"]
        assert result["replica"] == "stepped"


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
