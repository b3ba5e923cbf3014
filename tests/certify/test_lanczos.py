"""The Lanczos spectral estimates of matroot.spectrum.scaling against eigvalsh."""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot.spectrum.scaling import LANCZOS_SAFETY, lanczos_ritz_extremes
from matroot.testing import random_orthogonal, spd_stack

from conftest import to_numpy


def _with_spectrum(lam, seed=0):
    rng = np.random.default_rng(seed)
    q = random_orthogonal(rng, (), len(lam))
    return (q * lam) @ q.T


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ritz_values_lie_inside_the_spectrum(backend, dtype):
    rng = np.random.default_rng(1)
    a, _, lam = spd_stack(rng, (2, 3), 60, 1e3, spread="uniform")
    x = backend.asarray(a, dtype)
    lo, hi = lanczos_ritz_extremes(x, num_steps=12)
    assert lo.shape == hi.shape == (2, 3)
    u = 1e-5 if dtype == "float32" else 1e-12
    assert np.all(lo >= lam.min(axis=-1) * (1 - u))
    assert np.all(hi <= lam.max(axis=-1) * (1 + u))
    # Even a dense uniform top is resolved to a few percent in 12 steps.
    assert np.all(hi >= 0.97 * lam.max(axis=-1))


def test_exhausted_krylov_space_gives_exact_extremes():
    """n ≤ num_steps: the Ritz values are the eigenvalues."""
    lam = np.array([1e-3, 0.2, 0.5, 3.0, 7.0])
    lo, hi = lanczos_ritz_extremes(_with_spectrum(lam), num_steps=40)
    assert lo == pytest.approx(1e-3, rel=1e-8) and hi == pytest.approx(7.0, rel=1e-12)


@pytest.mark.parametrize("a", [np.eye(6) * 3.0, np.zeros((6, 6)), np.diag([2.0, 2, 2, 5, 5])],
                         ids=["scaled-identity", "zero", "two-values"])
def test_breakdown_restarts_stay_inside_the_spectrum(a):
    """Invariant subspaces end the Krylov space early (β = 0); the restart keeps
    every Ritz value an eigenvalue's upper/lower bound and nothing turns NaN."""
    lam = np.linalg.eigvalsh(a)
    lo, hi = lanczos_ritz_extremes(a, num_steps=10)
    assert np.isfinite(lo) and np.isfinite(hi)
    assert lo == pytest.approx(lam.min(), abs=1e-12)
    assert hi == pytest.approx(lam.max(), abs=1e-12)


def _rank_five_plus_ridge():
    g = np.random.default_rng(7).standard_normal((3, 100, 5))
    a = g @ g.transpose(0, 2, 1) + 1e-3 * np.eye(100)
    return a, np.linalg.eigvalsh(a)


def _assert_inside(lo, hi, lam, dtype):
    # Rounding of the run: n·u of λmax either side.
    slack = 100 * np.finfo(dtype).eps * lam[:, -1]
    assert np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))
    assert np.all(lo >= lam[:, 0] - slack) and np.all(hi <= lam[:, -1] + slack)
    # The ridge's eigenspace is reached at the first restart, the top within 6 steps.
    assert np.all(lo <= lam[:, 0] + slack) and np.all(hi >= lam[:, -1] - slack)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_many_restarts_stay_inside_the_spectrum(backend, dtype):
    """Rank 5 plus a ridge: the Krylov space is exhausted after 6 steps and all 58
    later steps restart. There v lies in the ridge's eigenspace and the rounding
    of v·A is u·‖A‖, far above u·‖v·A‖; a breakdown test relative to ‖v·A‖ kept
    that noise as directions, and orthogonality was lost geometrically (Ritz
    values of 1e22 after 64 steps)."""
    if backend.name == "jax":
        pytest.skip("eager JAX compiles each op of the run anew; the traced run is tested below")
    a, lam = _rank_five_plus_ridge()
    lo, hi = lanczos_ritz_extremes(backend.asarray(a, dtype))
    _assert_inside(lo, hi, lam, dtype)


def test_many_restarts_stay_inside_the_spectrum_under_jit():
    """The same run traced (the fixed-shape loop of jax.jit)."""
    jax = pytest.importorskip("jax")
    from matroot.spectrum.scaling import lanczos_ritz_extremes_core

    a, lam = _rank_five_plus_ridge()
    lo, hi = jax.jit(lanczos_ritz_extremes_core)(jax.numpy.asarray(a, dtype="float32"))
    _assert_inside(np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64), lam,
                   "float32")


def test_empty_and_unbatched_shapes():
    lo, hi = lanczos_ritz_extremes(np.zeros((0, 4, 4)))
    assert lo.shape == (0,)
    est = matroot.lambda_min_estimate(np.diag([1.0, 4.0]), np.asarray(4.0))
    assert est.shape == ()


def _spectra(n, kappa, rng):
    bottom = np.full(n, 1 / kappa) * (1 + 0.1 * rng.uniform(size=n))
    bottom[: n // 4] = rng.uniform(0.01, 1, n // 4)
    wishart = np.linalg.eigvalsh(np.cov(rng.standard_normal((n, 3 * n))))
    wishart = 1 / kappa + (1 - 1 / kappa) * (wishart - wishart.min()) / np.ptp(wishart)
    return {"low-rank+ridge": bottom, "wishart": wishart,
            "geometric": np.geomspace(1 / kappa, 1, n)}


@pytest.mark.parametrize("kappa", [1e2, 1e4], ids=lambda k: f"kappa{k:.0e}")
def test_estimate_is_a_lower_bound_where_documented(kappa):
    """Clustered, Wishart-like and geometric spectra up to κ = 1e4 (n = 300): the
    estimate lies in [λmin/(2·safety), λmin], i.e. below λmin and not far."""
    rng = np.random.default_rng(int(kappa))
    for name, lam in _spectra(300, kappa, rng).items():
        a = _with_spectrum(lam, seed=3).astype(np.float32)
        est = float(matroot.lambda_min_estimate(a, np.float32(1.0)))
        assert lam.min() / (2 * LANCZOS_SAFETY) <= est <= lam.min() * (1 + 1e-4), name


def test_estimate_of_dense_spectrum_errs_high_but_bounded():
    """Geometric κ = 1e6: Lanczos cannot reach the bottom in 64 steps; the estimate
    is high by about 10 (the solvers' residual stop absorbs that), not by 1e3 like
    the old power iteration on λmax·I − A."""
    lam = np.geomspace(1e-6, 1, 400)
    est = float(matroot.lambda_min_estimate(_with_spectrum(lam).astype(np.float32),
                                            np.float32(1.0)))
    assert 1e-6 < est < 1e-4


def test_estimate_keeps_namespace_and_clips(backend):
    a = backend.asarray(np.stack([np.diag([0.5, 2.0, 3.0]), np.zeros((3, 3))]), "float32")
    est = matroot.lambda_min_estimate(a, backend.asarray(np.array([0.25, 1.0]), "float32"))
    assert est.dtype == a.dtype
    np.testing.assert_allclose(to_numpy(est), [0.25, 0.0], atol=1e-6)
