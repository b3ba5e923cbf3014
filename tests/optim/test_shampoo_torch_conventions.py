"""Shampoo's torch shell as scripts written for AdamW, torch's optimizers and
Distributed Shampoo use it after swapping in matroot: tensor hyperparameters, option
names and hints, checkpoints across dtypes and shapes, model surgery, settings changed
mid-run. Each test is a finding (a crash with an unclear error, a silently ignored
setting, a broken torch.optim convention) and fails without its fix, unless its
docstring says it pins a convention that already held. Muon's torch shell:
``polar/test_muon_conventions.py``."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from matroot.optim import Muon, Shampoo, ShampooConfig  # noqa: E402

SHAMPOO = dict(lr=1e-2, block_size=4, precondition_frequency=2)


def _mlp(dtype, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(),
                               torch.nn.Linear(5, 3)).to(dtype)


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


def _state_layout(opt):
    """(key, dtype, shape) of every tensor of a state dict, families included."""
    sd = opt.state_dict()
    per_param = sorted((i, k, v.dtype, tuple(v.shape)) for i, entry in sd["state"].items()
                       for k, v in entry.items() if torch.is_tensor(v))
    stacks = [(name, j, a.dtype, tuple(a.shape)) for record in sd.get("shampoo_families", [])
              for name in ("factors", "roots", "factor_bounds")
              for j, a in enumerate(record[name]) if a is not None]
    return per_param, stacks


DTYPE_CHANGES = [(torch.float32, torch.bfloat16), (torch.float32, torch.float64),
                 (torch.float64, torch.float32), (torch.bfloat16, torch.float64)]


@pytest.mark.parametrize("saved, loading", DTYPE_CHANGES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("optimizer", [Shampoo, Muon])
def test_a_checkpoint_loads_into_a_model_of_another_dtype(optimizer, saved, loading):
    """A float32 model's checkpoint loaded into the model in float64 kept float32
    moments, factors and roots (and a float64 one's stayed float64 in float32), where
    torch's loader casts state to the parameters' dtype: the state must be a fresh
    optimizer's (Shampoo's dtypes: float32 for 16-bit parameters), values carried over.
    Muon already followed torch's rule (its state is in the parameters' dtype): pinned."""
    kwargs = SHAMPOO if optimizer is Shampoo else dict(lr=0.02)
    model = _mlp(saved)
    opt = optimizer(model.parameters(), **kwargs)
    _train(model, opt, 4)
    checkpoint = _through_torch_save(opt.state_dict())

    reloaded = _mlp(loading)
    resumed = optimizer(reloaded.parameters(), **kwargs)
    resumed.load_state_dict(checkpoint)
    fresh_model = _mlp(loading)
    fresh = optimizer(fresh_model.parameters(), **kwargs)
    _train(fresh_model, fresh, 4)
    per_param, stacks = _state_layout(resumed)
    assert (per_param, stacks) == _state_layout(fresh)
    assert optimizer is Muon or any(name == "roots" for name, *_ in stacks)
    key = "exp_avg_sq" if optimizer is Shampoo else "momentum_buffer"
    loaded = resumed.state[reloaded[0].weight][key]
    assert torch.equal(loaded, checkpoint["state"][0][key].to(loaded.dtype))
    _train(reloaded, resumed, 2)
    assert all(torch.isfinite(p).all() for p in reloaded.parameters())
    assert _state_layout(resumed) == _state_layout(fresh)


def test_shampoo_refuses_a_dtype_change_that_merges_factor_stacks():
    """Parameters of two float dtypes keep factors in two stacks of one family; loading
    into a model where both have one dtype would merge them: a clear refusal."""
    torch.manual_seed(0)
    mixed = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).double()])
    opt = Shampoo(mixed.parameters(), **SHAMPOO)
    for layer in mixed:
        layer(torch.ones(2, 4, dtype=layer.weight.dtype)).sum().backward()
    opt.step()
    single = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    with pytest.raises(ValueError, match="load it into a model of the saved dtypes"):
        Shampoo(single.parameters(), **SHAMPOO).load_state_dict(opt.state_dict())


def _two_layers():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def test_shampoo_refuses_a_checkpoint_of_a_model_whose_shapes_changed():
    """Pinned (it held): Shampoo's saved layout names the shapes it was made for."""
    old, new = torch.nn.Linear(6, 8), torch.nn.Linear(6, 9)
    opt = Shampoo(old.parameters(), **SHAMPOO)
    old(torch.ones(2, 6)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="layout does not fit the parameters' shapes"):
        Shampoo(new.parameters(), **SHAMPOO).load_state_dict(opt.state_dict())


def test_shampoo_takes_tensor_betas_as_torch_adam_does():
    """``betas=(torch.tensor(0.9), torch.tensor(0.999))`` (torch's Adam takes it) raised
    "betas[0] must be a finite real number, got tensor(0.9000)"."""
    first, second = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
    second.load_state_dict(first.state_dict())
    betas = (torch.tensor(0.9), torch.tensor(0.999))
    optimizers = [Shampoo(first.parameters(), betas=betas, **SHAMPOO),
                  Shampoo(second.parameters(), betas=tuple(b.item() for b in betas), **SHAMPOO)]
    for model, opt in zip((first, second), optimizers):
        _train(model, opt, 3)
    # Same program and inputs, the betas read as the same floats: the same bits.
    assert torch.equal(first.weight, second.weight)


@pytest.mark.parametrize("keyword, says", [
    ("epsilon", r"'matrix_eps' \(the factors' ridge, Distributed Shampoo's epsilon\)"),
    ("max_preconditioner_dim", "is the block size: use block_size"),
    ("use_decoupled_weight_decay", "weight_decay_type='decoupled' or 'l2'"),
    ("preconditioner_config", "use root_method")])
def test_shampoo_hints_the_option_a_distributed_shampoo_script_means(keyword, says):
    """A Distributed Shampoo script's ``max_preconditioner_dim`` was answered "did you
    mean 'max_preconditioned_dim'?" (which leaves long dimensions unpreconditioned: its
    block size is ``block_size``) and ``epsilon`` (the factors' ridge there) "did you
    mean 'eps'?" (Adam's denominator here): following the hint changed the method."""
    with pytest.raises(TypeError, match=f"no option '{keyword}' .*{says}"):
        Shampoo(torch.nn.Linear(4, 3).parameters(), **{keyword: 1})


def test_shampoo_names_a_parameter_removed_from_its_group_after_the_first_step():
    """Model surgery (a layer replaced, its old parameters taken out of the group) made
    the next step fail with ``KeyError: 140481104174832``: a family's stacks cannot drop
    a member, which now says so, at the step and at state_dict()."""
    model = _two_layers()
    opt = Shampoo(model.parameters(), **SHAMPOO)
    _train(model, opt, 1)
    old = model[2]
    model[2] = torch.nn.Linear(5, 3)
    group = opt.param_groups[0]
    group["params"] = [p for p in group["params"] if p is not old.weight and p is not old.bias]
    opt.add_param_group({"params": list(model[2].parameters())})
    with pytest.raises(ValueError, match=r"shape \(3, 5\) left the parameter groups.*new "
                                         "optimizer"):
        _train(model, opt, 1)
    with pytest.raises(ValueError, match="left the parameter groups"):
        opt.state_dict()


def test_shampoo_refuses_a_block_setting_changed_after_the_first_step():
    """``group["precondition"] = True`` after a warm-up (or a new ``skip_dims``, or
    ``block_size`` in every group) was ignored in silence: the blocks were planned at
    the first step (the docs said the per-dimension fields were read at every step).
    A checkpoint still loads into an optimizer made with other settings: torch's
    loader puts the saved ones back."""
    model = _two_layers()
    params = list(model.parameters())

    def make():
        return Shampoo([{"params": params[:2], "precondition": False},
                        {"params": params[2:]}], **SHAMPOO)
    opt = make()
    _train(model, opt, 2)
    checkpoint = opt.state_dict()
    blocks = opt.diagnostics()["blocks"]
    opt.param_groups[0]["precondition"] = True
    with pytest.raises(ValueError, match=r"^precondition changed in the group of a parameter "
                                         r"of shape \(5, 6\) after its first step"):
        _train(model, opt, 1)
    opt.param_groups[0]["precondition"] = False
    for group in opt.param_groups:
        group["block_size"] = 2
    with pytest.raises(ValueError, match=r"^block_size changed"):
        _train(model, opt, 1)
    resumed = make()
    resumed.param_groups[1]["skip_dims"] = (0,)
    resumed.load_state_dict(checkpoint)
    _train(model, resumed, 1)
    assert resumed.diagnostics()["blocks"] == blocks


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


@pytest.mark.parametrize("kwargs, error", [
    (dict(lr=-1.0), ValueError), (dict(betas=(0.9, 1.2)), ValueError),
    (dict(root_method="qr"), ValueError), (dict(block_size=0), ValueError),
])
def test_bad_hyperparameters_are_rejected(kwargs, error):
    with pytest.raises(error):
        Shampoo(torch.nn.Linear(3, 3).parameters(), **kwargs)
    opt = Shampoo(torch.nn.Linear(3, 3).parameters())
    with pytest.raises(error):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))], **kwargs})


def test_integer_parameters_are_rejected():
    with pytest.raises(TypeError, match="floating"):
        Shampoo([torch.zeros(3, dtype=torch.int64)])


def test_group_configs_are_validated_once_and_again_only_after_a_change(monkeypatch):
    built = []
    validate = ShampooConfig.__post_init__

    def counting(self):
        built.append(self)
        validate(self)

    monkeypatch.setattr(ShampooConfig, "__post_init__", counting)
    model = torch.nn.Linear(6, 4)
    opt = Shampoo(model.parameters(), lr=1e-2, block_size=8, precondition_frequency=2,
                  distributed=None)
    x, y = torch.randn(16, 6), torch.randn(16, 4)

    def steps(count):
        for _ in range(count):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    steps(2)
    settled = len(built)
    steps(3)
    assert len(built) == settled
    opt.param_groups[0]["lr"] = 5e-3            # as a scheduler would
    steps(1)
    assert len(built) > settled
    opt.param_groups[0]["betas"] = (1.5, 0.999)
    with pytest.raises(ValueError, match="betas"):
        steps(1)
