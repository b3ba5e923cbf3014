"""The optimizer shells as other people's training scripts use them: each test is a
finding of a red-team round (a crash with an unclear error, a silently wrong update,
a broken torch.optim / optax convention) and fails without its fix."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")
from matroot.optim.optax import muon, shampoo  # noqa: E402

#: float32's machine epsilon (twice its unit roundoff), for tolerances.
F32_EPS = float(np.finfo(np.float32).eps)

#: Small and quick: roots every other step, by a matmul-only method.
QUICK = dict(precondition_frequency=2, root_method="newton_db")


def _params():
    """A flax-like pytree: two dense layers, kernels and biases."""
    rng = np.random.default_rng(0)
    return {"dense": {"kernel": jnp.asarray(rng.standard_normal((8, 6)), jnp.float32),
                      "bias": jnp.zeros(6, jnp.float32)},
            "out": {"kernel": jnp.asarray(rng.standard_normal((6, 4)), jnp.float32),
                    "bias": jnp.zeros(4, jnp.float32)}}


def _all_finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree_util.tree_leaves(tree))


#: No root refresh in the few steps of a test: eager JAX solves op by op (slow), and
#: skipping a step involves no root.
NO_REFRESH = dict(precondition_frequency=100)


def _nan_like(tree):
    return jax.tree_util.tree_map(lambda g: g.at[0].set(jnp.nan), tree)


def test_optax_shampoo_skips_a_step_with_nan_gradients():
    """The optax shell ignored ``nonfinite_grads``: a NaN gradient reached the updates
    and the moments and factors, so every later step was NaN too."""
    params = {"w": jnp.ones((4, 3), jnp.float32)}
    opt = shampoo(1e-2, nonfinite_grads="skip", **NO_REFRESH)
    good = {"w": jnp.ones((4, 3), jnp.float32)}
    _, state = opt.update(good, opt.init(params), params)
    updates, skipped = opt.update(_nan_like(good), state, params)
    assert int(skipped[0].skipped_steps) == 1
    assert int(skipped[0].step) == int(state[0].step) == 1
    assert bool(jnp.all(updates["w"] == 0))
    updates, after = opt.update(good, skipped, params)
    assert _all_finite(updates) and _all_finite(after[0].exp_avg)
    assert _all_finite([f for f in after[0].factors if f is not None])


def test_optax_shampoo_raises_on_nan_gradients_eagerly():
    from matroot.optim import NonFiniteGradientError

    params = {"w": jnp.ones((4, 3), jnp.float32)}
    opt = shampoo(1e-2, **NO_REFRESH)
    with pytest.raises(NonFiniteGradientError, match="nonfinite_grads='skip'"):
        opt.update(_nan_like(params), opt.init(params), params)


def test_optax_shampoo_skips_nan_gradients_under_jit_whatever_the_policy():
    """A traced step cannot raise: under ``jax.jit`` a NaN/Inf gradient skips the
    step on the device and is counted (before: NaN updates and a poisoned state)."""
    params = {"w": jnp.ones((4, 3), jnp.float32)}
    opt = shampoo(1e-2, **QUICK)            # the default policy, "raise"
    step = jax.jit(opt.update)
    good = jax.tree_util.tree_map(jnp.ones_like, params)
    updates, state = step(_nan_like(good), opt.init(params), params)
    assert int(state[0].skipped_steps) == 1 and int(state[0].step) == 0
    assert all(bool(jnp.all(u == 0)) for u in jax.tree_util.tree_leaves(updates))
    for _ in range(2):                      # the second step refreshes the roots
        updates, state = step(good, state, params)
    assert _all_finite(updates) and _all_finite(state[0].exp_avg)
    assert int(state[0].root_refreshes) == 1


def test_optax_shampoo_steps_inside_lax_scan_with_constant_gradients():
    """A scan traces the step though its gradients may be constants: the policy check
    must see that (the carried state is traced) rather than read a traced flag."""
    params = {"w": jnp.ones((4, 3), jnp.float32)}
    grads = {"w": jnp.full((4, 3), 0.5, jnp.float32)}
    opt = shampoo(1e-2, **NO_REFRESH)

    def body(carry, _):
        p, state = carry
        updates, state = opt.update(grads, state, p)
        return (optax.apply_updates(p, updates), state), None

    (params, state), _ = jax.lax.scan(body, (params, opt.init(params)), None, length=2)
    assert int(state[0].step) == 2 and _all_finite(params)


def test_optax_shampoo_of_an_empty_pytree_is_a_no_op():
    """``optax.masked`` with every leaf masked out hands its inner transformation an
    empty pytree; ``init`` raised "params is empty"."""
    params = {"w": jnp.ones((4, 3), jnp.float32)}
    opt = optax.masked(shampoo(1e-2), {"w": False})
    updates, _ = opt.update(params, opt.init(params), params)
    assert bool(jnp.all(updates["w"] == params["w"]))      # masked: passed through


@pytest.mark.parametrize("factory", [lambda: shampoo(1e-2, **NO_REFRESH), lambda: muon(1e-2)],
                         ids=["shampoo", "muon"])
def test_optax_state_restored_as_numpy_arrays_steps_eagerly(factory):
    """A state restored from a checkpoint as NumPy arrays (flax.serialization does)
    failed an eager step: "Multiple namespaces" (Shampoo), "output array is
    read-only" (Muon). Under jit it always worked (arguments become arrays)."""
    params = {"w": jnp.ones((4, 3), jnp.float32), "b": jnp.zeros(3, jnp.float32)}
    grads = {"w": jnp.arange(12.0, dtype=jnp.float32).reshape(4, 3), "b": jnp.ones(3, jnp.float32)}
    opt = factory()
    _, state = opt.update(grads, opt.init(params), params)
    restored = jax.tree_util.tree_map(np.asarray, state)
    expected, _ = opt.update(grads, state, params)
    updates, _ = opt.update(grads, restored, params)
    for name in params:     # same program, same inputs: bitwise
        np.testing.assert_array_equal(updates[name], expected[name])


def test_optax_shampoo_says_how_to_pass_params_for_weight_decay():
    params = _params()
    opt = shampoo(1e-2, **QUICK)
    with pytest.raises(ValueError, match=r"update\(grads, state, params\).*weight_decay=0"):
        opt.update(params, opt.init(params))


def test_optax_muon_use_muon_tree_inside_optax_masked():
    """``optax.masked`` hides masked-out leaves from its inner transformation; a
    ``use_muon`` tree read by leaf position then gave the flags to the wrong leaves
    (here: the first kernel got AdamW, silently)."""
    params = _params()
    is_matrix = jax.tree_util.tree_map(lambda p: p.ndim == 2, params)
    opt = optax.masked(muon(1e-2, use_muon=is_matrix), is_matrix)
    state = opt.init(params)
    assert state.inner_state[0].exp_avg_sq == [None, None]     # both kernels: Muon
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    updates, _ = opt.update(grads, state, params)
    # An all-ones m×n gradient's polar factor is 1/√(mn) everywhere, times the shape
    # scale √max(1, m/n); Polar Express's 4 steps land the singular value in
    # [0.8, 1.2]. AdamW's first step would be -lr everywhere.
    m, n = params["dense"]["kernel"].shape
    muon_entry = 1e-2 * np.sqrt(max(1.0, m / n)) / np.sqrt(m * n)
    kernel_update = -np.asarray(updates["dense"]["kernel"])
    assert np.all(kernel_update >= 0.8 * muon_entry) and np.all(kernel_update <= 1.2 * muon_entry)


def test_optax_muon_use_muon_may_be_a_prefix_tree_and_a_wrong_one_is_named():
    params = _params()
    state = muon(1e-2, use_muon={"dense": True, "out": False}).init(params)
    # Leaves in key order: dense.bias, dense.kernel, out.bias, out.kernel.
    assert [v is None for v in state[0].exp_avg_sq] == [True, True, False, False]
    with pytest.raises(ValueError, match="use_muon must be a pytree of bools"):
        muon(1e-2, use_muon={"dense": True}).init(params)


def test_optax_inject_hyperparams_schedules_shampoos_learning_rate():
    """``optax.inject_hyperparams(shampoo)`` failed: it passed ``**hyperparameters``
    back as one keyword named ``hyperparameters``."""
    params = {"w": jnp.ones((4, 3), jnp.float32)}
    grads = {"w": jnp.arange(12.0, dtype=jnp.float32).reshape(4, 3)}
    injected = optax.inject_hyperparams(shampoo)(learning_rate=0.5, eps=1e-6, **NO_REFRESH)
    updates, state = injected.update(grads, injected.init(params), params)
    plain = shampoo(0.5, eps=1e-6, **NO_REFRESH)
    expected, _ = plain.update(grads, plain.init(params), params)
    # eps = 1e-6 comes back rounded to float32 from the injected state: a few roundings.
    np.testing.assert_allclose(updates["w"], expected["w"], rtol=16 * F32_EPS)
    assert float(state.hyperparams["learning_rate"]) == 0.5


def test_optax_inject_hyperparams_names_a_static_hyperparameter_under_jit():
    params = {"w": jnp.ones((4, 3), jnp.float32)}
    opt = optax.inject_hyperparams(shampoo)(learning_rate=0.1, **NO_REFRESH)
    with pytest.raises(TypeError, match=r"static_args=\('precondition_frequency',\)"):
        jax.jit(opt.update)(params, opt.init(params), params)


def test_optax_inject_hyperparams_takes_shampoos_weight_decay_under_jit():
    """``inject_hyperparams(shampoo)(learning_rate=..., weight_decay=...)``, the
    ``optax.adamw`` habit: the decay is an array under jit, applied by the shell."""
    params = {"w": jnp.full((4, 3), 2.0, jnp.float32)}
    grads = {"w": jnp.arange(12.0, dtype=jnp.float32).reshape(4, 3)}
    injected = optax.inject_hyperparams(shampoo, static_args=("precondition_frequency",))(
        learning_rate=0.1, weight_decay=0.3, **NO_REFRESH)
    updates, _ = jax.jit(injected.update)(grads, injected.init(params), params)
    plain = shampoo(0.1, weight_decay=0.3, **NO_REFRESH)
    expected, _ = plain.update(grads, plain.init(params), params)
    # jit against eager: float32 arithmetic fused and ordered differently.
    np.testing.assert_allclose(updates["w"], expected["w"], rtol=16 * F32_EPS)


def test_optax_inject_hyperparams_schedules_muons_learning_rate_and_decay_under_jit():
    params = {"w": jnp.ones((4, 3), jnp.float32), "b": jnp.ones(3, jnp.float32)}
    # A well-conditioned gradient: the polar factor of a rank-deficient one would
    # amplify the rounding differences of jit and eager.
    grads = {"w": jnp.asarray(np.random.default_rng(0).standard_normal((4, 3)), jnp.float32),
             "b": jnp.ones(3, jnp.float32)}
    # momentum too (a warm-up of μ is common): an array the core applies as it is.
    injected = optax.inject_hyperparams(muon)(learning_rate=0.1, weight_decay=0.5,
                                              momentum=0.9)
    plain = muon(0.1, weight_decay=0.5, momentum=0.9)
    state, plain_state = injected.init(params), plain.init(params)
    step = jax.jit(injected.update)
    # μ = 0.9 in float32 against a Python float, jit against eager: float32 rounding,
    # amplified by the polar factor up to the gradient's condition number.
    rtol = 100 * F32_EPS * np.linalg.cond(np.asarray(grads["w"]))
    for _ in range(2):
        updates, state = step(grads, state, params)
        expected, plain_state = plain.update(grads, plain_state, params)
        for name in params:
            np.testing.assert_allclose(updates[name], expected[name], rtol=rtol, atol=rtol)
    with pytest.raises(TypeError, match=r"static_args=\('polar_lower',\)"):
        bad = optax.inject_hyperparams(muon)(learning_rate=0.1, polar_lower=1e-3)
        jax.jit(bad.update)(grads, bad.init(params), params)


# torch shells ---------------------------------------------------------------------------

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
    from matroot.optim.muon import default_use_muon

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
