"""The optax shell and the functional core: equality with NumPy, purity, jit, training."""

from __future__ import annotations

import numpy as np
import pytest

from matroot.optim import ShampooConfig, apply_updates, init, update

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")
from matroot.optim.optax import shampoo  # noqa: E402

HYPER = dict(block_size=6, precondition_frequency=2, root_method="evd", weight_decay=1e-2,
             betas=(0.9, 0.95))


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _toy(seed=0):
    """A matrix larger than a block, a vector and a scalar, with a quadratic loss."""
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((9, 4)), "b": rng.standard_normal(4),
              "s": np.asarray(0.5)}
    targets = {k: rng.standard_normal(np.shape(v)) for k, v in params.items()}
    return params, targets


def _grads(params, targets, k):
    return {name: (k + 1) * (params[name] - targets[name]) ** 3 + params[name]
            for name in params}


#: Roots solved every step and not kept, from step 3 (under jit a device-side choice).
NOT_KEPT = dict(HYPER, precondition_frequency=1, start_preconditioning_step=3, keep_roots=False)


@pytest.mark.parametrize("jit, hyper", [(False, HYPER), (True, HYPER), (True, NOT_KEPT)],
                         ids=["eager", "jit", "jit-roots-not-kept"])
def test_optax_matches_numpy_core(jit, hyper):
    params, targets = _toy()
    names = sorted(params)  # jax flattens dicts by sorted key
    # The NumPy reference keeps its roots: not keeping them changes no update.
    config = ShampooConfig(lr=0.05, **dict(hyper, keep_roots=True))
    np_params = [params[n] for n in names]
    np_state = init(np_params, config)
    opt = shampoo(0.05, **hyper)
    jx_params = {n: jnp.asarray(v) for n, v in params.items()}
    jx_state = opt.init(jx_params)
    step = jax.jit(opt.update) if jit else opt.update
    for k in range(5):
        g = _grads(dict(zip(names, np_params)), targets, k)
        np_updates, np_state = update([g[n] for n in names], np_state, np_params, config)
        np_params = apply_updates(np_params, np_updates)
        jx_updates, jx_state = step({n: jnp.asarray(v) for n, v in g.items()}, jx_state,
                                    jx_params)
        jx_params = optax.apply_updates(jx_params, jx_updates)
        for n, u in zip(names, np_updates):
            np.testing.assert_allclose(np.asarray(jx_updates[n]), u, rtol=1e-9, atol=1e-12)
    assert int(jx_state[0].root_refreshes) == np_state.root_refreshes == (
        3 if hyper is NOT_KEPT else 2)
    assert all(r is None for r in jx_state[0].roots) == (hyper is NOT_KEPT)


def test_core_update_does_not_touch_its_inputs():
    params, targets = _toy(1)
    config = ShampooConfig(lr=0.05, precondition_frequency=1, **{
        k: v for k, v in HYPER.items() if k != "precondition_frequency"})
    leaves = [params[n] for n in sorted(params)]
    state = init(leaves, config)
    grads = list(_grads(dict(zip(sorted(params), leaves)), targets, 0).values())
    snapshot = [np.copy(a) for a in state.exp_avg + state.exp_avg_sq + state.factors
                + state.roots]
    grad_copies = [np.copy(g) for g in grads]
    _, new_state = update(grads, state, leaves, config)
    after = state.exp_avg + state.exp_avg_sq + state.factors + state.roots
    for before, now in zip(snapshot, after):
        np.testing.assert_array_equal(before, now)
    for before, now in zip(grad_copies, grads):
        np.testing.assert_array_equal(before, now)
    assert new_state.step == 1 and state.step == 0
    assert not np.array_equal(new_state.factors[0], state.factors[0])


def test_chain_with_clipping_and_schedule_is_jittable_and_checkpointable():
    params, targets = _toy(2)
    params = {n: jnp.asarray(v) for n, v in params.items()}
    schedule = optax.linear_schedule(0.05, 0.01, transition_steps=6)
    opt = optax.chain(optax.clip_by_global_norm(1.0), shampoo(schedule, **HYPER))

    @jax.jit
    def step(params, state, k):
        g = _grads(params, targets, k)
        updates, state = opt.update(g, state, params)
        return optax.apply_updates(params, updates), state

    state = opt.init(params)
    for k in range(3):
        params, state = step(params, state, k)
    # A checkpoint is the pytree of arrays itself: to host and back.
    restored = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x)), state)
    a, _ = step(params, state, 3)
    b, _ = step(params, restored, 3)
    for name in params:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))
    assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(state))


def test_shampoo_under_jit_beats_adamw_on_digits():
    """A 64-32-10 MLP on scikit-learn's digits, full batch, equal steps."""
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x = jnp.asarray(digits.data / 16.0, dtype=jnp.float32)
    y = jax.nn.one_hot(jnp.asarray(digits.target), 10)
    rng = np.random.default_rng(0)
    init_params = {
        "w1": jnp.asarray(rng.standard_normal((64, 32)) / 8, dtype=jnp.float32),
        "b1": jnp.zeros(32, jnp.float32),
        "w2": jnp.asarray(rng.standard_normal((32, 10)) / np.sqrt(32), dtype=jnp.float32),
        "b2": jnp.zeros(10, jnp.float32)}

    def loss(p):
        logits = jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return optax.softmax_cross_entropy(logits, y).mean()

    def train(opt, steps=60):
        params, state = init_params, opt.init(init_params)

        @jax.jit
        def step(params, state):
            value, grads = jax.value_and_grad(loss)(params)
            updates, state = opt.update(grads, state, params)
            return optax.apply_updates(params, updates), state, value

        for _ in range(steps):
            params, state, _ = step(params, state)
        return float(loss(params))

    adamw = train(optax.adamw(1e-2))
    ours = train(shampoo(1e-2, precondition_frequency=5, root_method="newton_db",
                         matrix_eps=1e-6))
    assert ours < adamw, (ours, adamw)


@pytest.mark.parametrize("committed", [False, True], ids=["default", "device_put"])
def test_the_jitted_step_compiles_once(committed):
    """A state whose arrays are committed to a device while others are not (or the
    other way round from the params) makes jax.jit compile the step again at step 2."""
    import jax.monitoring

    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    if committed:
        params = jax.device_put(params, jax.devices()[0])
    opt = shampoo(0.1, precondition_frequency=2, root_method="newton_db")
    state = opt.init(params)
    assert {leaf.committed for leaf in jax.tree_util.tree_leaves(state)} == {committed}

    def loss(p):
        return jnp.sum((p["w"] - 2.0) ** 2) + jnp.sum(p["b"] ** 2)

    @jax.jit
    def step(params, state):
        updates, state = opt.update(jax.grad(loss)(params), state, params)
        return optax.apply_updates(params, updates), state

    compiles = []

    def count(name, _duration, **_):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    def hit(name, **_):
        # The suite's on-disk compilation cache (conftest) may hand the step an executable
        # an earlier test compiled: that is jax.jit's compile too, without the backend.
        if name == "/jax/compilation_cache/cache_hits":
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(count)
    jax.monitoring.register_event_listener(hit)
    try:
        for _ in range(4):
            params, state = step(params, state)
        jax.block_until_ready(params)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
        jax.monitoring.unregister_event_listener(hit)
    assert len(compiles) == 1, compiles
    assert int(state[0].step) == 4


def test_a_root_that_overflows_float16_storage_is_a_counted_failure_under_jit():
    """The torch shell's test (test_shampoo_root_storage) through the optax shell: factors of
    1e-27·I have roots ~4.7e6·I, Inf in float16; each refresh fails and is counted, the
    blocks keep their identity roots and the updates stay finite."""
    params = {"w": jnp.ones((4, 4), dtype=jnp.float32)}
    opt = shampoo(1e-2, block_size=4, precondition_frequency=1, start_preconditioning_step=1,
                  matrix_eps=1e-27, root_storage_dtype="float16", root_method="newton_db",
                  symmetric_packing=False)
    state = opt.init(params)
    step = jax.jit(opt.update)
    for _ in range(2):
        updates, state = step({"w": 1e-12 * jnp.eye(4, dtype=jnp.float32)}, state, params)
    inner = state[0]
    assert sum(int(f.sum()) for f in inner.root_failures) == 2 * 2
    assert all(bool(jnp.all(r.astype(jnp.float32) == jnp.eye(4))) for r in inner.roots)
    assert bool(jnp.all(jnp.isfinite(updates["w"])))
