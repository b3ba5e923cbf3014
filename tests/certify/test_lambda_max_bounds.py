"""The λmax upper bounds of matroot.spectrum.lambda_max_bounds against a float64 eigh oracle.

The randomized bound may fall below λmax with probability at most 1e-12 per
matrix; every matrix below must get a bound at or above its λmax (the λmax of the
matrix as given, in its dtype, computed in float64), and a seeded experiment with
a loose failure probability checks that failures happen no more often than stated.
"""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot.spectrum.lambda_max_bounds import (FAILURE_PROBABILITY, randomized_lambda_max,
                                       randomized_margin)
from matroot.spectrum.scaling import lambda_max_bound, ritz_values, spectral_bounds
from matroot.testing.spectra import family_stack, random_orthogonal

from conftest import to_numpy


def _rank_one_plus_tiny(rng, batch, n):
    lam = np.full((*batch, n), 1e-8)
    lam[..., -1] = 1.0
    return _rotated(rng, lam)


def _rotated(rng, lam):
    q = random_orthogonal(rng, lam.shape[:-1], lam.shape[-1])
    return (q * lam[..., None, :]) @ np.swapaxes(q, -1, -2)


def _gram_plus_ridge(rng, batch, n):
    g = rng.standard_normal((*batch, n, max(1, n // 4)))
    return g @ np.swapaxes(g, -1, -2) + 1e-3 * n * np.eye(n)


def _stack(kind, rng, batch, n):
    if kind == "rank_one_plus_tiny":
        return _rank_one_plus_tiny(rng, batch, n)
    if kind == "gram_plus_ridge":
        return _gram_plus_ridge(rng, batch, n)
    return family_stack(kind, rng, batch, n, 1e4)


KINDS = ("isolated_top", "clustered", "rank_one_plus_tiny", "gram_plus_ridge", "uniform")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [2, 5, 64, 65, 200, 512])
@pytest.mark.parametrize("kind", KINDS)
def test_randomized_bound_is_above_lambda_max_on_every_matrix(kind, n, dtype):
    rng = np.random.default_rng(n)
    a = _stack(kind, rng, (2 if n == 512 else 6,), n).astype(dtype)
    # The oracle: the matrix as given (rounded to dtype), decomposed in float64.
    top = np.linalg.eigvalsh(a.astype(np.float64))[..., -1]
    for scale in (1.0, 1e-30 if dtype == "float64" else 1e-20):
        bound = lambda_max_bound(a * np.asarray(scale, dtype), bound_certificate="randomized")
        assert bound.dtype == a.dtype
        assert np.all(bound >= top * scale), (bound / (top * scale)).min()
        # Tight enough to be worth it: well inside the Frobenius bound's √n.
        assert np.all(bound <= 1.25 * top * scale), (bound / (top * scale)).max()


def test_small_matrices_are_bounded_with_certainty():
    # n ≤ the Lanczos steps: the run spans the whole space, no probabilistic margin.
    assert randomized_margin(64, 64) == 0.0
    assert randomized_margin(65, 64) > 0.0
    a = _stack("isolated_top", np.random.default_rng(3), (4,), 40)
    top = np.linalg.eigvalsh(a)[..., -1]
    bound = lambda_max_bound(a, bound_certificate="randomized")
    assert np.all(bound >= top) and np.all(bound <= top * (1 + 1e-10))


def test_margin_meets_the_stated_failure_probability():
    # 1.648·√n·exp(−√ε·(2k − 1)) = δ at the returned ε, with k = steps − 1.
    for n, steps in ((100, 20), (384, 64), (4096, 64)):
        eps = randomized_margin(n, steps)
        k = steps - 1
        assert 1.648 * np.sqrt(n) * np.exp(-np.sqrt(eps) * (2 * k - 1)) == pytest.approx(
            FAILURE_PROBABILITY, rel=1e-9)
    assert randomized_margin(4096, 4) == 1.0  # no bound from so few steps


def test_seeded_failure_rate_is_within_the_stated_probability():
    # A fixed start vector against Haar-rotated copies of one matrix is a uniformly
    # random start against that matrix. A spectrum Lanczos resolves slowly: one
    # eigenvalue at 1 over a dense bulk up to 0.95, n = 100, 5 steps, δ = 0.3.
    rng = np.random.default_rng(7)
    n, draws, steps, delta = 100, 600, 5, 0.3
    lam = np.concatenate([np.linspace(0.0, 0.95, n - 1), [1.0]])
    a = _rotated(rng, np.broadcast_to(lam, (draws, n)))
    bound = to_numpy(randomized_lambda_max(a, num_steps=steps, failure_probability=delta).bound)
    # Binomial(600, 0.3) exceeds 0.3 + 4.5 standard deviations with probability < 1e-5.
    assert np.mean(bound < 1.0) <= delta + 4.5 * np.sqrt(delta * (1 - delta) / draws)
    # The experiment can see failures: with a quarter of the margin (measured: 35 %
    # of these draws fall short) a bound too small for the theorem would show.
    theta = ritz_values(a, num_steps=steps).high
    assert np.mean(theta / (1 - randomized_margin(n, steps, delta) / 4) < 1.0) > 0.1


def test_bound_certificate_keyword(backend):
    rng = np.random.default_rng(5)
    # Eager JAX compiles every op of the 64-step run anew: a size whose run spans
    # the whole space keeps it short (jit is tested below).
    a = _stack("isolated_top", rng, (3,), 40 if backend.name == "jax" else 96)
    top = np.linalg.eigvalsh(a)[..., -1]
    x = backend.asarray(a, "float32")
    for certificate in ("randomized", "cholesky"):
        bound = to_numpy(lambda_max_bound(x, bound_certificate=certificate))
        assert np.all(bound >= top * (1 - 1e-6)), certificate
        interval = spectral_bounds(x, bound_certificate=certificate)
        assert np.all(to_numpy(interval.lambda_max) >= top * (1 - 1e-6))
    with pytest.raises(ValueError, match="bound_certificate"):
        lambda_max_bound(x, bound_certificate="proof")


def test_randomized_bound_under_jit():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from matroot.spectrum.scaling import lambda_max_bound_core

    a = _stack("clustered", np.random.default_rng(9), (3,), 80)
    top = np.linalg.eigvalsh(a)[..., -1]
    x = jnp.asarray(a, dtype=jnp.float32)
    jitted = np.asarray(jax.jit(lambda m: lambda_max_bound_core(m))(x))
    eager = lambda_max_bound_core(a.astype(np.float32))
    assert np.all(jitted >= top * (1 - 1e-6))
    # Two programs (traced vs eager Lanczos): equal to float32 rounding of the run.
    np.testing.assert_allclose(jitted, eager, rtol=64 * 80 * 2.0**-24)


def test_public_names_stay_importable_from_scaling():
    from matroot.spectrum.scaling import (CertifiedBound, RitzValues, certified_lambda_max,  # noqa: F401
                                 lambda_min_estimate, lanczos_ritz_extremes, power_iteration,
                                 ritz_values, verified_upper)
    assert matroot.lambda_max_bound is lambda_max_bound


# chebyshev's degree cap does not reach κ = 1e4 (nothing converges to judge).
@pytest.mark.parametrize("method", ["newton_db", "coupled_newton", "minimax"])
@pytest.mark.parametrize("kind", ["isolated_top", "clustered", "gram_plus_ridge"])
def test_inv_root_scaled_by_the_randomized_bound(method, kind):
    """inv_root_info(bound_certificate=...): the bound it reports is above λmax, converged
    roots meet the table, and the result states the bound's failure probability
    where its 64-step run does not span the space (n = 96), none where it does."""
    from matroot.testing import oracle_inv_root, relative_error
    from matroot.solvers.registry import accuracy_target

    a = _stack(kind, np.random.default_rng(11), (3,), 96)
    lam = np.linalg.eigvalsh(a)
    for certificate, stated in (("randomized", FAILURE_PROBABILITY), ("cholesky", 0.0)):
        res = matroot.inv_root_info(a, 2, method=method, bound_certificate=certificate)
        assert res.failure_probability == stated
        assert np.all(to_numpy(res.lambda_max) >= lam[:, -1] * (1 - 1e-12))
        err = relative_error(to_numpy(res.root), oracle_inv_root(a, 2))
        target = accuracy_target(method, "float64", 2, lam[:, -1] / lam[:, 0])
        converged = to_numpy(res.converged)
        assert converged.any()
        assert np.all(err[converged] <= target[converged])
    small = matroot.inv_root_info(a[:, :40, :40], 2, method=method,
                                  bound_certificate="randomized")
    assert small.failure_probability == 0.0
    with pytest.raises(ValueError, match="bound_certificate"):
        matroot.inv_root(a, 2, method=method, bound_certificate="proof")
