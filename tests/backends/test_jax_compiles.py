"""How many programs an eager JAX user's calls compile.

Eager JAX compiles every operation (or ``jax.jit`` program) for its shapes and static
arguments on first use, seconds each time on a CPU. A value that is data, not structure
(``eps``, ``safety``), must be a traced argument, so that a user who sweeps it or whose
ridge changes compiles once; a loop whose arrays change shape from step to step (the
eager Lanczos run's growing basis) must run as one program. Counted here: the programs
lowered to XLA (``jax.monitoring``'s lowering event), one per new program whether the
run's compilation cache then serves it or not.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import matroot
from matroot.testing import oracle_inv_root, relative_error

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

_LOWERING = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_COUNTS = [0]


def _count(event: str, duration: float, **_kwargs) -> None:
    if event == _LOWERING:
        _COUNTS[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count)


@contextlib.contextmanager
def lowered():
    """``[n]``: the programs lowered inside the block, filled in at its end."""
    out = [0]
    start = _COUNTS[0]
    yield out
    out[0] = _COUNTS[0] - start


def _gram(shape, dtype, seed=0):
    g = np.random.default_rng(seed).standard_normal(shape)
    return g @ np.swapaxes(g, -1, -2), jnp.asarray(g @ np.swapaxes(g, -1, -2), dtype=dtype)


@pytest.mark.parametrize("options", [dict(method="newton_db"),
                                     dict(method="coupled_newton"),
                                     dict(method="newton_db", rtol=1e-3, steps="fixed")],
                         ids=["newton_db", "coupled_newton", "fixed"])
def test_a_new_eps_compiles_nothing_new(options):
    host, a = _gram((3, 24, 12), jnp.float32)
    matroot.inv_root(a, 4, eps=1e-2, **options).block_until_ready()
    for eps in (2e-2, 0.5, 3.0):
        with lowered() as count:
            info = matroot.inv_root_info(a, 4, eps=eps, **options)
            jax.block_until_ready(info)
        assert count[0] == 0, f"eps={eps} compiled {count[0]} new programs"
        # The traced ridge is the one asked for (a stale one would miss the oracle).
        assert bool(jnp.all(info.converged))
        error = relative_error(np.asarray(info.root, dtype=np.float64),
                               oracle_inv_root(host, 4, eps))
        assert np.all(error <= 1e-3), (eps, error)


def test_eps_zero_and_positive_are_two_programs_of_one_call():
    """``eps > 0`` is structure (the ridge's λmin floor replaces a Lanczos estimate)."""
    host, a = _gram((2, 16, 16), jnp.float32, seed=1)
    for eps in (0.0, 1e-1):
        info = matroot.inv_root_info(a, 2, eps=eps, method="minimax")
        error = relative_error(np.asarray(info.root, dtype=np.float64),
                               oracle_inv_root(host, 2, eps))
        assert bool(jnp.all(info.converged)) and np.all(error <= 1e-3), (eps, error)


@pytest.mark.parametrize("certificate", ["randomized", "cholesky"])
def test_lambda_max_bound_is_one_program_per_shape(certificate):
    """Eagerly the randomized bound's Lanczos run lowered about 400 programs per new n
    (its basis grows a row a step: new shapes each time), 20-40 s on a CPU."""
    host, a = _gram((3, 40, 40), jnp.float32, seed=2)
    with lowered() as first:
        bound = matroot.lambda_max_bound(a, bound_certificate=certificate)
        bound.block_until_ready()
    doubled = (a * 2).block_until_ready()
    with lowered() as again:
        matroot.lambda_max_bound(doubled, bound_certificate=certificate,
                                 safety=1.1).block_until_ready()
    # A fresh process also lowers a small shared program or two (3 when this test runs
    # first in its process, 2 after others): a handful, against ~400 before.
    assert first[0] <= 4 and again[0] == 0, (first[0], again[0])
    lam_max = np.linalg.eigvalsh(host)[..., -1]
    assert np.all(np.asarray(bound, dtype=np.float64) >= lam_max * (1 - 1e-6))
    assert np.all(np.asarray(bound, dtype=np.float64) <= lam_max * 1.5)


def test_spectral_bounds_is_one_program_per_shape():
    host, a = _gram((2, 30, 30), jnp.float32, seed=3)
    with lowered() as first:
        b = matroot.spectral_bounds(a, eps=1e-3)
        jax.block_until_ready(b)
    with lowered() as again:
        jax.block_until_ready(matroot.spectral_bounds(a, eps=2e-3))
    # A handful (3 when this test runs first in its process, as under -n 2 it may).
    assert first[0] <= 4 and again[0] == 0, (first[0], again[0])
    lam = np.linalg.eigvalsh(host)
    assert np.all(np.asarray(b.lambda_max) >= (lam[..., -1] + 1e-3) * (1 - 1e-6))
    assert np.all(np.asarray(b.lambda_min) >= 1e-3 * (1 - 1e-6))


def test_an_eager_optax_step_compiles_nothing_new_once_warm():
    """The bias corrections ``1 − βᵗ`` took the step count as a concrete integer
    exponent, which eager JAX compiles as a program per value: one compile a step."""
    optax = pytest.importorskip("optax")
    from matroot.optim import optax as matroot_optax

    opt = matroot_optax.shampoo(1e-2, precondition_frequency=100)
    params = {"w": jnp.ones((4, 3)) / 4, "b": jnp.zeros(3)}
    grads = {"w": jnp.full((4, 3), 0.5), "b": jnp.ones(3)}
    state = opt.init(params)
    counts = []
    for _ in range(4):
        with lowered() as count:
            updates, state = opt.update(grads, state, params)
            params = optax.apply_updates(params, updates)
            jax.block_until_ready(params)
        counts.append(count[0])
    assert counts[2:] == [0, 0], counts


@pytest.mark.parametrize("name", ["inv_root", "refresh_eigenbasis", "lambda_max_bound"])
def test_an_eager_vmap_compiles_once(name):
    """Under an eager ``jax.vmap`` the solve took the traced path op by op, and its
    loops (``lax.while_loop``\\ s of fresh closures) were traced and compiled again at
    every call: 3 programs and 4-13 s a call for a 4×48×48 ``inv_root``."""
    host, a = _gram((3, 12, 12), jnp.float32, seed=4)
    basis = jnp.broadcast_to(jnp.eye(12, dtype=jnp.float32), a.shape)
    calls = {"inv_root": lambda x, q: matroot.inv_root(x, 4, eps=1e-2, method="newton_db"),
             "refresh_eigenbasis": lambda x, q: matroot.refresh_eigenbasis(x, q).eigenvalues,
             "lambda_max_bound": lambda x, q: matroot.lambda_max_bound(
                 x, bound_certificate="randomized")}
    mapped = jax.vmap(calls[name])
    first = mapped(a, basis)
    jax.block_until_ready(first)
    with lowered() as again:
        jax.block_until_ready(mapped(a, basis))
    assert again[0] == 0, again[0]
    if name == "inv_root":
        error = relative_error(np.asarray(first, dtype=np.float64),
                               oracle_inv_root(host, 4, 1e-2))
        assert np.all(error <= 1e-3), error
    elif name == "refresh_eigenbasis":
        np.testing.assert_allclose(np.asarray(first), np.linalg.eigvalsh(host),
                                   rtol=1e-4, atol=1e-4 * np.abs(host).max())


def test_an_eager_gradient_is_a_few_programs():
    """jax.grad of an eager inv_root evaluated the derivative's eigh and formula one
    operation at a time, each compiled on first use: 59 programs for one shape (35 for
    jax.jvp); the formula is one program now, and the gradient matches the jitted one."""
    host, a = _gram((2, 10, 10), jnp.float32, seed=5)

    def loss(x):
        return jnp.sum(matroot.inv_root(x, 2, eps=1e-2, method="newton_db") ** 2)

    with lowered() as count:
        eager = jax.grad(loss)(a)
        jax.block_until_ready(eager)
    assert count[0] <= 20, count[0]
    compiled = jax.jit(jax.grad(loss))(a)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(compiled), rtol=1e-4,
                               atol=1e-4 * float(jnp.abs(compiled).max()))


def test_an_eager_polar_gradient_is_a_few_programs():
    """jax.grad of an eager polar ran its derivative's SVD and formula one operation at
    a time (50 programs lowered for one shape); one program now, and the
    gradient matches the jitted one and the float64 derivative."""
    from matroot.polar_factor.gradient import polar_derivative

    host = np.random.default_rng(6).standard_normal((2, 12, 6))
    g, weights = jnp.asarray(host, jnp.float32), jnp.arange(6.0)

    def loss(x):
        return jnp.sum(matroot.polar(x, method="svd") * weights)

    with lowered() as count:
        eager = jax.grad(loss)(g)
        jax.block_until_ready(eager)
    assert count[0] <= 20, count[0]
    compiled = jax.jit(jax.grad(loss))(g)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(compiled), rtol=1e-4, atol=1e-5)
    exact = polar_derivative(host, np.broadcast_to(np.arange(6.0), host.shape))
    np.testing.assert_allclose(np.asarray(eager), exact, rtol=1e-3, atol=1e-4)
