"""evd costs one eigh: no scaling pass, float32 where it meets the table, float64 retry."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import matroot

from conftest import to_numpy
from matroot.testing import oracle_inv_root, relative_error, spd_stack

# The module, not the function that matroot.solvers re-exports under the same name.
evd_module = importlib.import_module("matroot.solvers.evd")


def _mixed_stack(n=24):
    """Matrix 0 well conditioned (float32 suffices), matrix 1 at κ = 1e5 (it does not)."""
    rng = np.random.default_rng(3)
    good, _, _ = spd_stack(rng, (1,), n, 10.0)
    bad, _, _ = spd_stack(rng, (1,), n, 1e5)
    return np.concatenate([good, bad]).astype(np.float32)


def test_no_power_iteration_and_exact_lambda_max(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("evd must not estimate λmax")

    monkeypatch.setattr("matroot.roots.lambda_max_bound_core", forbidden)
    a = np.stack([np.diag([1.0, 4.0, 9.0]), np.diag([2.0, 2.0, 3.0])])
    res = matroot.inv_root_info(a, 2, method="evd")
    assert res.lambda_max.tolist() == [9.0, 3.0]
    np.testing.assert_allclose(np.diagonal(res.root[0]), [1.0, 0.5, 1 / 3])


def test_float32_check_flags_ill_conditioned_matrices(backend):
    lam = backend.asarray(np.array([[0.5, 1.0], [1e-5, 1.0], [-1e-3, 1.0],
                                    [np.nan, 1.0]]), "float32")
    assert to_numpy(evd_module.float32_eigh_suffices(lam, 2)).tolist() == [
        True, False, False, False]


def test_retry_only_what_float32_cannot_do(backend, monkeypatch):
    """The ill-conditioned matrix meets the κ = 1e5 table entry (via the float64 retry
    where eigh is genuinely float32); the other is bitwise what it is alone."""
    calls = []
    real = evd_module._retry_in_float64

    def spy(xp, a, lam, root, redo, p):
        calls.append(to_numpy(redo).tolist())
        return real(xp, a, lam, root, redo, p)

    monkeypatch.setattr(evd_module, "_retry_in_float64", spy)
    a = _mixed_stack()
    x = backend.asarray(a)
    together = to_numpy(matroot.inv_root(x, 4, method="evd", compute_dtype="float32"))
    alone = to_numpy(matroot.inv_root(x[:1, ...], 4, method="evd", compute_dtype="float32"))
    assert np.array_equal(together[0], alone[0])
    err = relative_error(together, oracle_inv_root(a, 4))
    assert err[0] <= 1e-5 and err[1] <= 1e-3, err
    genuinely_float32 = not matroot._xp.eigh_runs_in_float64(backend.xp)
    assert calls == ([[False, True]] if genuinely_float32 else [])


@pytest.mark.parametrize("p", [1, 2, 4])
def test_float32_results_meet_the_table_where_accepted(p):
    """Where the check keeps a float32 eigh, its root meets the table (torch: MKL ssyevd)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(p)
    checked = 0
    for n in (4, 32, 128):
        for kappa in (10.0, 60.0, 300.0, 3e3):
            a = spd_stack(rng, (4,), n, kappa)[0].astype(np.float32)
            lam = torch.linalg.eigvalsh(torch.asarray(a))
            if not bool(evd_module.float32_eigh_suffices(lam, p).all()):
                continue
            root = matroot.inv_root(torch.asarray(a), p, method="evd", compute_dtype="float32")
            err = relative_error(root.numpy(),
                                 oracle_inv_root(a, p)).max()
            table = 1e-5 if kappa <= 1e2 else 1e-4
            assert err <= table, (n, kappa, err)
            checked += 1
    assert checked >= 3
