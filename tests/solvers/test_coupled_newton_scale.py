"""Coupled Newton's initial scaling: λmax mapped to (p+1)/2 instead of 1."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import matroot
from matroot.testing import oracle_inv_root, relative_error, spd_stack


coupled_newton_module = sys.modules["matroot.solvers.coupled_newton"]


def _stack(kappa, seed):
    rng = np.random.default_rng(seed)
    a, _, _ = spd_stack(rng, (2,), 96, kappa, lam_max=3.0)
    return a.astype(np.float32)


def test_initial_scale_is_mid_basin():
    assert [coupled_newton_module.initial_scale(p) for p in (1, 2, 4, 8)] == [1, 1.5, 2.5, 4.5]


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("kappa", [1e2, 1e4, 1e6], ids=lambda k: f"kappa{k:.0e}")
def test_mid_basin_start_saves_steps(monkeypatch, p, kappa):
    """Same matrices, same tol: never more steps than mapping λmax to 1, one fewer
    from κ = 1e4 on, and at least as accurate."""
    x = _stack(kappa, seed=p)
    ref = oracle_inv_root(x, p)
    new = matroot.inv_root_info(x, p, method="coupled_newton")
    monkeypatch.setattr(coupled_newton_module, "initial_scale", lambda p: 1.0)
    old = matroot.inv_root_info(x, p, method="coupled_newton")
    assert np.all(new.converged) and np.all(old.converged)
    saved = old.iterations - new.iterations
    assert np.all(saved >= (1 if kappa >= 1e4 else 0)), (old.iterations, new.iterations)
    assert relative_error(new.root, ref).max() <= 1.5 * relative_error(old.root, ref).max()


def test_first_step_is_a_scaling_not_a_product():
    x = _stack(1e2, seed=0)
    res = matroot.inv_root_info(x, 4, method="coupled_newton")
    # Per step X·N, N², N⁴ = N²·N², N⁴·M; the first X·N is t^(1/4)·N.
    per_step = 2 + coupled_newton_module.power_matmuls(4)
    assert res.matmuls.tolist() == (per_step * res.iterations - 1).tolist()
