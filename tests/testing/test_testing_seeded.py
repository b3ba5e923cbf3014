"""matroot.testing's seeded stacks: the benchmark's scaled SPD stacks and Shampoo factors."""

from __future__ import annotations

import numpy as np
import pytest

from matroot.testing import SPDCase, scaled_spd_stack, shampoo_factors
from matroot.testing.spectra import bulk_spectrum


@pytest.mark.parametrize("spread", ["geometric", "bulk"])
@pytest.mark.parametrize("n", [1, 2, 3, 16, 40])
def test_scaled_stack_has_kappa_and_a_scale_per_matrix(spread, n):
    a = scaled_spd_stack(6, n, 1e3, seed=4, dtype=np.float64, spread=spread)
    assert a.shape == (6, n, n)
    np.testing.assert_array_equal(a, np.swapaxes(a, -1, -2))
    lam = np.linalg.eigvalsh(a)
    top = lam[:, -1]
    # Per-matrix scales, log-uniform in [0.1, 10]; κ = 1e3 up to float64 eigh's rounding.
    assert np.all((top > 0.1 * (1 - 1e-12)) & (top < 10 * (1 + 1e-12)))
    if n > 1:
        assert len(np.unique(top)) == 6
        np.testing.assert_allclose(top / lam[:, 0], 1e3, rtol=1e-9)


def test_scaled_stack_is_rebuilt_from_its_seed():
    # The same program on the same input: bitwise equal by construction.
    first = scaled_spd_stack(3, 24, 1e4, seed=11, spread="bulk")
    np.testing.assert_array_equal(first, scaled_spd_stack(3, 24, 1e4, seed=11, spread="bulk"))
    assert first.dtype == np.float32
    assert not np.array_equal(first, scaled_spd_stack(3, 24, 1e4, seed=12, spread="bulk"))


def test_bulk_spectrum_is_a_dense_top_over_a_tail():
    for n in (3, 8, 16, 64, 257):
        lam = bulk_spectrum(n, 1e4)
        assert len(lam) == n and np.all(np.diff(lam) > 0)
        assert lam[0] == pytest.approx(1e-4) and lam[-1] == 1.0
        assert np.sum(lam >= 0.5) == n - max(2, n // 8) + 1  # 1/2 opens the tail
    lam = bulk_spectrum(256, 1e4)
    # The Frobenius norm is about sqrt(n)/2 times λmax: why the benchmark measures it.
    assert 0.7 * np.sqrt(256) / 2 < np.linalg.norm(lam) < np.sqrt(256) / 2 * 1.7


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch=0, n=4, kappa=10.0), "n and batch must be >= 1"),
    (dict(batch=2, n=4, kappa=0.5), "kappa must be >= 1"),
    (dict(batch=2, n=4, kappa=10.0, spread="uniform"), "spread 'uniform' is not one of"),
])
def test_scaled_stack_names_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        scaled_spd_stack(**kwargs)


def test_shampoo_factors_are_psd_gram_sums_with_log_spaced_energy():
    factors = shampoo_factors(5, 20, seed=3)
    np.testing.assert_allclose(factors, np.swapaxes(factors, -1, -2), atol=0)
    lam = np.linalg.eigvalsh(factors)
    assert lam.min() > -1e-12
    # Trace = total gradient energy, log-spaced from 1 down to 1e-3.
    np.testing.assert_allclose(np.trace(factors, axis1=-2, axis2=-1),
                               np.geomspace(1.0, 1e-3, 5), rtol=1e-12)
    # Rank-1 gradients over 4 steps give rank <= 4: the ridge sets lambda_min.
    assert np.sum(lam[0] > 1e-12 * lam[0, -1]) <= 4


def test_shampoo_factors_oracle_is_the_inverse_root():
    factors = shampoo_factors(3, 12, seed=1)
    oracle = SPDCase(factors, 1e-3, "shampoo_factors")  # the demo's oracle
    a = factors + 1e-3 * np.eye(12)
    x = oracle.inv_root(4)
    # X^4 (A + eps I) = I for the exact inverse 4th root.
    np.testing.assert_allclose(x @ x @ x @ x @ a, np.broadcast_to(np.eye(12), a.shape),
                               atol=1e-9)
    assert np.all(oracle.kappa >= 1)
