"""The float64 oracle is accurate enough to grade float64 roots past κ = 1e9.

A float64 eigh moves λmin by about n·u·λmax, so the root it gives is off by about
n·u·κ/p: a float64 solver's own size of error there. ``oracle_inv_root(refine=True)``
corrects it in long double; checked against 40-digit mpmath.
"""

from __future__ import annotations

import numpy as np
import pytest

from matroot.testing import (oracle_inv_root, polar_relative_error, random_orthogonal,
                             relative_error)

LONG_DOUBLE_WIDER = np.finfo(np.longdouble).eps < np.finfo(np.float64).eps


def _mp_root(a, p):
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    e, q = mpmath.eigsy(mpmath.matrix(a.tolist()))
    d = mpmath.diag([v ** (mpmath.mpf(-1) / p) for v in e])
    return np.array((q * d * q.T).tolist(), dtype=float)


@pytest.mark.skipif(not LONG_DOUBLE_WIDER, reason="long double is float64 here")
@pytest.mark.parametrize("n", [2, 3, 8, 16])
@pytest.mark.parametrize("p", [1, 2, 8])
def test_refined_oracle_is_far_below_the_rounding_floor(n, p):
    rng = np.random.default_rng(n)
    lam = 10.0 ** rng.uniform(0, 12, (2, n))
    lam[:, 0], lam[:, -1] = 1.0, 10.0 ** rng.uniform(9.5, 12, 2)
    lam[1, 1:-1] = lam[1, -1]  # a flat bulk over one small eigenvalue
    q = random_orthogonal(rng, (2,), n)
    a = (q * lam[:, None, :]) @ np.swapaxes(q, -1, -2)
    a = (a + np.swapaxes(a, -1, -2)) / 2
    w = np.linalg.eigvalsh(a)
    floor = 2.0**-53 * w[:, -1] / w[:, 0] / p
    exact = np.stack([_mp_root(m, p) for m in a])
    refined = relative_error(oracle_inv_root(a, p, refine=True), exact)
    assert np.all(refined <= 1e-2 * floor), refined / floor


def test_refined_oracle_agrees_with_the_plain_one_where_both_are_exact():
    a = np.diag([4.0, 16.0, 1.0])[None]
    assert np.allclose(oracle_inv_root(a, 2, refine=True), oracle_inv_root(a, 2), rtol=1e-15)
    shifted = np.diag(np.array([5.0, 17.0, 2.0]) ** -0.5)
    assert np.allclose(oracle_inv_root(a, 2, 1.0, refine=True), shifted)


def test_the_polar_oracle_is_not_the_weak_link_at_high_kappa():
    """The float64 SVD oracle is itself off by about u·κ: at κ ≈ 5e6 it disagreed with
    the exact factor by 8e-10, above the bound a converged float64 factor is held to
    (5e-10), so a right factor read as wrong. With its long double correction it is
    within (u·κ)² of a 40-digit reference (here 2e-14 where the SVD alone is 2e-11;
    asserted 1e-12)."""
    mp = pytest.importorskip("mpmath")
    from matroot.testing import oracle_polar
    if np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
        pytest.skip("long double is float64 on this platform: no correction to test")
    rng = np.random.default_rng(5)
    u = np.linalg.qr(rng.standard_normal((40, 3)))[0]
    v = np.linalg.qr(rng.standard_normal((3, 3)))[0]
    g = (u * np.array([1.0, 2e-7, 2e-7])) @ v.T
    mp.mp.dps = 40
    big = mp.matrix(g.tolist())
    lam, w = mp.eigsy(big.T * big)
    exact = np.array((big * w * mp.diag([1 / mp.sqrt(x) for x in lam]) * w.T).tolist(),
                     dtype=float)
    assert polar_relative_error(oracle_polar(g), exact) <= 1e-12
    # The wide layout is the transpose's.
    np.testing.assert_array_equal(oracle_polar(g.T), oracle_polar(g).T)
