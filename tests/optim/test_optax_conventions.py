"""The optax shells (Shampoo and Muon) as other people's training scripts use them:
NaN gradients, lax.scan, masks, inject_hyperparams, apply_if_finite, traced init,
changed models, option names. Each test is a finding (a crash with an unclear error, a
silently wrong update, a broken optax convention) and fails without its fix. The torch
shells: ``optim/test_shampoo_torch_conventions.py``, ``polar/test_muon_conventions.py``."""

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


def test_shampoo_updates_keep_the_gradients_dtype():
    """optax's transforms return updates in the gradients' dtype: a bfloat16 model's
    hand-written ``p + u`` must not turn its parameters into float32."""
    params = {"w": jnp.ones((8, 4), jnp.bfloat16), "b": jnp.ones((4,), jnp.bfloat16)}
    grads = jax.tree_util.tree_map(
        lambda p: ((jnp.arange(p.size).reshape(p.shape) % 3 + 1) * 0.1).astype(p.dtype), params)
    tx = shampoo(1e-3)
    updates, _ = tx.update(grads, tx.init(params), params)
    assert jax.tree_util.tree_map(lambda u: u.dtype, updates) == {"w": jnp.bfloat16,
                                                                  "b": jnp.bfloat16}
    assert all(bool(jnp.all(jnp.isfinite(u.astype(jnp.float32))))
               for u in jax.tree_util.tree_leaves(updates))


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


def test_optax_muon_names_optax_contribs_option_and_the_fix():
    """optax.contrib.muon's ``beta`` is ``momentum`` here."""
    pytest.importorskip("optax")
    from matroot.optim.optax import muon
    with pytest.raises(TypeError, match=r"scale_by_muon has no option 'beta' .*use momentum"):
        muon(1e-2, beta=0.9)


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
