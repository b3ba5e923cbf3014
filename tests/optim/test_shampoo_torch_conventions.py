"""The torch and optax shells in a second red-team round, as scripts written for AdamW,
torch.optim.Muon, Distributed Shampoo and optax use them after swapping in matroot: each
test is a finding (a crash with an unclear error, a silently ignored setting, a broken
torch.optim or optax convention) and fails without its fix, unless its docstring says it
pins a convention that already held."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")
from torch_muon_reference import use_float32_iterates  # noqa: E402

from matroot.optim import Muon, Shampoo  # noqa: E402

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


def test_shampoo_refuses_a_checkpoint_of_a_model_whose_shapes_changed():
    """Pinned (it held): Shampoo's saved layout names the shapes it was made for."""
    old, new = torch.nn.Linear(6, 8), torch.nn.Linear(6, 9)
    opt = Shampoo(old.parameters(), **SHAMPOO)
    old(torch.ones(2, 6)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="layout does not fit the parameters' shapes"):
        Shampoo(new.parameters(), **SHAMPOO).load_state_dict(opt.state_dict())


def _jax_tree():
    jnp = pytest.importorskip("jax.numpy")
    pytest.importorskip("optax")
    return {"dense": {"kernel": jnp.ones((6, 5)) + jnp.eye(6, 5), "bias": jnp.zeros(5)}}


def test_optax_apply_if_finite_wraps_shampoo_eagerly():
    """``optax.apply_if_finite(shampoo(...), n)`` called eagerly (no jax.jit) failed at
    every step with TracerBoolConversionError: its lax.cond branch closes over concrete
    gradients, so Shampoo's eager NaN check ran ``bool()`` on a traced flag."""
    params = _jax_tree()
    import jax
    import jax.numpy as jnp
    import optax

    from matroot.optim.optax import shampoo
    opt = optax.apply_if_finite(shampoo(1e-2, block_size=4, precondition_frequency=1), 3)
    state = opt.init(params)
    nans = jax.tree_util.tree_map(lambda x: jnp.full_like(x, jnp.nan), params)
    updates, state = opt.update(nans, state, params)
    assert int(state.notfinite_count) == 1
    assert all(bool(jnp.all(u == 0)) for u in jax.tree_util.tree_leaves(updates))
    grads = jax.tree_util.tree_map(lambda x: x + 0.5, params)
    updates, state = opt.update(grads, state, params)
    assert int(state.notfinite_count) == 0 and int(state.inner_state[0].root_refreshes) == 1
    assert all(bool(jnp.all(jnp.isfinite(u)) & jnp.any(u != 0))
               for u in jax.tree_util.tree_leaves(updates))


@pytest.mark.parametrize("factory", ["shampoo", "muon"])
def test_optax_shells_name_the_leaf_a_changed_model_no_longer_fits(factory):
    """Gradients of a resized model met the state of the old one: Muon failed with
    "add got incompatible shapes for broadcasting", Shampoo with "gradient 0 has shape
    (7,), parameter has (5,)" though the user's parameter was (7,)."""
    params = _jax_tree()
    import jax.numpy as jnp

    from matroot.optim import optax as shells
    opt = getattr(shells, factory)(1e-2)
    state = opt.init(params)
    resized = {"dense": {"kernel": jnp.ones((6, 7)), "bias": jnp.zeros(7)}}
    with pytest.raises(ValueError, match=r"leaf 'dense.bias' has shape \(7,\) where the state "
                                         r"has \(5,\); init the optimizer again"):
        opt.update(resized, state, resized)
    grown = {**params, "extra": jnp.ones(3)}
    with pytest.raises(ValueError, match="the gradients have 3 leaves where the state has 2"):
        opt.update(grown, state, grown)


def test_optax_shampoo_init_runs_traced():
    """``jax.eval_shape(tx.init, params)`` (the abstract state orbax restores into, as
    flax's TrainState scripts build it), ``jax.jit(tx.init)`` and ``jax.vmap(tx.init)``
    (an ensemble) raised ConcretizationTypeError: init read the traced params'
    ``committed`` placement."""
    params = _jax_tree()
    import jax
    import jax.numpy as jnp

    from matroot.optim.optax import shampoo
    opt = shampoo(1e-2, block_size=4)
    eager = opt.init(params)
    abstract = jax.eval_shape(opt.init, params)
    assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(eager)
    assert [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(abstract)] == \
        [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(eager)]
    jitted = jax.jit(opt.init)(params)
    # Same program (init's jitted builder) on the same inputs: the same values.
    assert all(bool(jnp.array_equal(a, b)) for a, b in
               zip(jax.tree_util.tree_leaves(jitted), jax.tree_util.tree_leaves(eager)))
    ensemble = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), params)
    stacked = jax.vmap(opt.init)(ensemble)
    assert [a.shape for a in jax.tree_util.tree_leaves(stacked)] == \
        [(2, *a.shape) for a in jax.tree_util.tree_leaves(eager)]


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


def test_optax_muon_names_optax_contribs_option_and_the_fix():
    """optax.contrib.muon's ``beta`` is ``momentum`` here."""
    pytest.importorskip("optax")
    from matroot.optim.optax import muon
    with pytest.raises(TypeError, match=r"scale_by_muon has no option 'beta' .*use momentum"):
        muon(1e-2, beta=0.9)


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


def _one_step(model, opt):
    opt.zero_grad()
    model(torch.ones(4, 6)).square().mean().backward()
    opt.step()


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


def _two_layers_without_bias():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8, bias=False),
                               torch.nn.Linear(8, 3, bias=False))


def test_optax_muon_weight_decay_mask_spares_the_masked_leaves():
    """optax muon decayed every leaf (biases and norms too) with no way to say
    otherwise; ``weight_decay_mask`` is optax.contrib.muon's (and
    add_decayed_weights') way."""
    params = _jax_tree()
    import jax
    import jax.numpy as jnp

    from matroot.optim.optax import muon
    params["dense"]["bias"] = jnp.ones(5)
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    mask = {"dense": {"kernel": True, "bias": False}}
    for given, bias_moves in ((None, True), (mask, False)):
        opt = muon(0.1, weight_decay=0.5, weight_decay_mask=given)
        updates, _ = opt.update(zero, opt.init(params), params)
        # Zero gradients: the update is the decay alone, -lr·wd·W where it applies.
        assert bool(jnp.any(updates["dense"]["kernel"] != 0))
        assert bool(jnp.any(updates["dense"]["bias"] != 0)) == bias_moves
