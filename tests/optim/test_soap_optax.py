"""``matroot.optim.optax.soap``: under ``jax.jit`` it takes the torch shell's steps on the
same gradients; a NaN gradient is skipped on the device."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402

from matroot.optim import SOAP  # noqa: E402
from matroot.optim.optax import soap  # noqa: E402

SHAPES = {"a": (8, 6), "b": (8, 6), "c": (6, 8), "bias": (6,), "long": (3, 40)}
#: Tight refreshes on both sides: two libraries' rounding then gives the same bases
#: (up to order and signs, which the step does not see) to about 1e-5. The first refresh
#: is at step 2, where every factor has full rank (a null space has no unique basis).
OPTIONS = dict(betas=(0.9, 0.95), weight_decay=0.1, precondition_frequency=2,
               start_preconditioning_step=2,
               block_size=4, max_preconditioned_dim=16, eigenbasis_rtol=1e-5,
               eigenbasis_iterations=4)


@pytest.mark.parametrize("extra", [{}, dict(grafting="adam", grafting_beta2=0.99,
                                             start_preconditioning_step=3)],
                         ids=["plain", "adam-grafting"])
def test_jit_steps_equal_the_torch_shell(extra):
    """float32, jitted (the start of preconditioning a device-side select) against the
    torch shell (a host decision); with "adam" grafting from step 3 too."""
    options = dict(OPTIONS, **extra)
    rng = np.random.default_rng(0)
    start = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    grads = [{k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
             for _ in range(6)]
    opt = soap(0.02, **options)
    params = {k: jnp.asarray(v) for k, v in start.items()}
    state = opt.init(params)

    @jax.jit
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in start.items()}
    names = sorted(SHAPES)      # the pytree's leaf order
    torch_opt = SOAP([tensors[k] for k in names], lr=0.02, **options)
    for g in grads:
        params, state = step(params, state, {k: jnp.asarray(v) for k, v in g.items()})
        for k in names:
            tensors[k].grad = torch.tensor(g[k])
        torch_opt.step()
        for k in names:
            np.testing.assert_allclose(np.asarray(params[k]), tensors[k].detach().numpy(),
                                       rtol=2e-4, atol=2e-5, err_msg=k)
    assert int(state[0].refreshes) == torch_opt.diagnostics()["refreshes"] == 3 - bool(extra)


def test_nan_gradient_is_skipped_under_jit():
    opt = soap(0.1)
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    state = opt.init(params)
    update = jax.jit(opt.update)
    grads = {"w": jnp.ones((4, 3)).at[0, 0].set(jnp.nan), "b": jnp.ones(3)}
    updates, after = update(grads, state, params)
    assert all(not np.any(np.asarray(u)) for u in jax.tree_util.tree_leaves(updates))
    assert int(after[0].skipped_steps) == 1 and int(after[0].step) == 0


def test_lr_is_not_a_scale_by_soap_option():
    from matroot.optim.optax import scale_by_soap
    with pytest.raises(ValueError, match="scale_by_learning_rate"):
        scale_by_soap(lr=0.1)


def test_inject_hyperparams_learning_rate_under_jit():
    opt = optax.inject_hyperparams(soap, static_args=("precondition_frequency",))(
        learning_rate=0.1, precondition_frequency=2)
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    state = opt.init(params)

    def loss(p):
        return jnp.sum((p["w"] - 2.0) ** 2) + jnp.sum(p["b"] ** 2)

    @jax.jit
    def step(params, state):
        updates, state = opt.update(jax.grad(loss)(params), state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(3):
        params, state = step(params, state)
    assert float(loss(params)) < 12.0
    state.hyperparams["learning_rate"] = jnp.asarray(0.0)
    still, _ = step(params, state)
    assert float(loss(still)) == float(loss(params))
    traced = optax.inject_hyperparams(soap)(learning_rate=0.1, precondition_frequency=2)
    with pytest.raises(TypeError, match="static_args"):
        jax.jit(traced.update)(params, traced.init(params), params)


def test_inject_hyperparams_takes_soaps_weight_decay_under_jit():
    """``inject_hyperparams(soap)(learning_rate=..., weight_decay=...)`` (a decay
    schedule, ``optax.adamw``'s habit) was a TypeError under jit where Shampoo's shell
    took it: the decoupled decay is added by the shell, the same sum the core forms."""
    params = {"w": jnp.full((4, 3), 2.0, jnp.float32), "b": jnp.ones(3, jnp.float32)}
    grads = {"w": jnp.arange(12.0, dtype=jnp.float32).reshape(4, 3) / 10,
             "b": jnp.full(3, 0.5, jnp.float32)}
    injected = optax.inject_hyperparams(soap, static_args=("precondition_frequency",))(
        learning_rate=0.1, weight_decay=0.3, precondition_frequency=100)
    plain = soap(0.1, weight_decay=0.3, precondition_frequency=100)
    state, plain_state = injected.init(params), plain.init(params)
    step = jax.jit(injected.update)
    for _ in range(2):
        updates, state = step(grads, state, params)
        expected, plain_state = jax.jit(plain.update)(grads, plain_state, params)
        for key in params:
            np.testing.assert_allclose(updates[key], expected[key], rtol=1e-5, atol=1e-7)
    with pytest.raises(TypeError, match="weight_decay_type='decoupled'"):
        jax.jit(optax.inject_hyperparams(soap)(learning_rate=0.1, weight_decay=0.3,
                                               weight_decay_type="l2").update)(
            grads, state, params)
