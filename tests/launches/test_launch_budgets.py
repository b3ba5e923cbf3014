"""Issue 35's solve budgets, counted through torch's dispatcher on the CPU (deterministic):
every non-view ATen operation and every host read
(:class:`matroot.testing.launch_count.LaunchCount`, the issue's definition), for one
float32 8 × 384² stack with κ = 1e4 and ``rtol=5e-3`` as a new user calls it, plus
what a fixed-step solve promises: the first step always runs, converged roots meet
rtol against a float64 oracle, and a bad matrix changes no neighbour's bits.

On the CPU ``steps="auto"`` runs the adaptive loop (auto picks evd there); the counts
are of ``steps="fixed"``, which is what an accelerator runs with the same arguments.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import matroot
from conftest import to_numpy
from matroot.testing import oracle_inv_root, relative_error
from matroot.testing.spectra import ADVERSARIAL_FAMILIES, family_stack

torch = pytest.importorskip("torch")
from matroot.testing.launch_count import LaunchCount  # noqa: E402

#: DASH's cheapest configuration reaching 5e-3 on this stack (issue 35: coupled Newton,
#: Frobenius scaling, 14–16 steps), in operations per solve.
DASH_OPS = {2: 140, 4: 138}
#: The budgets these tests hold (the host verdict's counts of docs/launches.rst plus one):
#: minimax (what auto runs on an accelerator with rtol) within issue 35's ≤ 0.6× DASH at
#: p = 2 and 4.
BUDGETS = {("minimax", 2): 64, ("minimax", 4): 83, ("newton_db", 2): 92,
           ("newton_db", 4): 131, ("coupled_newton", 2): 106, ("coupled_newton", 4): 120}


@pytest.fixture(scope="module")
def problem():
    gen = torch.Generator().manual_seed(0)
    n, b = 384, 8
    q, _ = torch.linalg.qr(torch.randn(b, n, n, dtype=torch.float64, generator=gen))
    lam = torch.logspace(0, -4, n, dtype=torch.float64)
    return q, lam, ((q * lam) @ q.mT).float()


def _counted(a, p, method, verdict):
    matroot.inv_root_info(a, p, rtol=5e-3, method=method, steps="fixed", verdict=verdict)
    with LaunchCount() as count:  # the second call: constants kept across calls are made
        result = matroot.inv_root_info(a, p, rtol=5e-3, method=method, steps="fixed",
                                       verdict=verdict)
    return count, result


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("method", ["minimax", "newton_db", "coupled_newton"])
def test_operations_and_syncs_per_solve(problem, method, p):
    q, lam, a = problem
    host, result = _counted(a, p, method, "host")
    device, on_device = _counted(a, p, method, "device")
    exact = (q * lam ** (-1.0 / p)) @ q.mT
    error = torch.linalg.matrix_norm(result.root.double() - exact) / torch.linalg.matrix_norm(exact)
    assert bool(result.converged.all()) and float(error.max()) <= 5e-3
    assert torch.equal(result.root, on_device.root)
    assert host.syncs == 1 and device.syncs == 0, (host.syncs, device.syncs)
    assert host.ops <= BUDGETS[(method, p)], (host.ops, host.top(10))
    # The host read is the one reduction of the verdict's gate; the device verdict forms
    # the untrusted roots' infinite estimates and reduces per matrix instead.
    assert device.ops <= host.ops + 1


@pytest.mark.parametrize("p", [2, 4])
def test_minimax_within_the_issue_ratio(problem, p):
    """The method auto runs on an accelerator, called as a new user calls it: ≤ 0.6×
    DASH's operations at p = 2 and 4 (issue 35's goal)."""
    count, _ = _counted(problem[2], p, "minimax", "host")
    assert count.ops <= 0.6 * DASH_OPS[p], count.ops


def test_auto_picks_minimax_for_fixed_steps_on_an_accelerator(monkeypatch):
    from matroot.solvers import auto

    monkeypatch.setattr(auto._xp, "is_accelerator", lambda xp, a: True)
    a = np.eye(4)
    assert matroot.choose_method(np, a, 4, fixed_steps=True) == "minimax"
    assert matroot.choose_method(np, a, 3, fixed_steps=True) == "coupled_newton"
    assert matroot.choose_method(np, a, 4) == auto.ACCELERATOR_METHOD


@pytest.mark.parametrize("verdict", ["host", "device"])
@pytest.mark.parametrize("method", ["minimax", "newton_db", "coupled_newton"])
def test_a_bad_matrix_changes_no_neighbour(method, verdict):
    """Issue 36 found minimax changing a neighbour's bits or flags: here NaN, Inf, an
    all-zero and an indefinite matrix sit among good ones, which must come back with the
    same bits and flags as when solved alone."""
    rng = np.random.default_rng(3)
    good = family_stack("geometric", rng, (3,), 24, 1e3).astype(np.float32)
    bad = np.stack([np.full((24, 24), np.nan), np.where(np.eye(24) > 0, np.inf, 0.0),
                    np.zeros((24, 24)), -np.eye(24)]).astype(np.float32)
    mixed = np.concatenate([good[:1], bad[:2], good[1:2], bad[2:], good[2:]])
    where_good = [0, 3, 6]
    options = dict(p=2, rtol=1e-2, method=method, steps="fixed", verdict=verdict,
                   check_finite=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        together = matroot.inv_root_info(torch.from_numpy(mixed), **options)
        alone = [matroot.inv_root_info(torch.from_numpy(good[i:i + 1]), **options)
                 for i in range(3)]
    for k, i in enumerate(where_good):
        assert torch.equal(together.root[i], alone[k].root[0])
        assert bool(together.converged[i]) == bool(alone[k].converged[0]) is True
        assert float(together.error_estimate[i]) == float(alone[k].error_estimate[0])
    assert not together.converged[[1, 2, 4, 5]].any()
    assert torch.isnan(together.root[[1, 2, 4]]).all()


def test_nonfinite_input_raises_with_the_host_verdict():
    a = np.stack([np.eye(8), np.full((8, 8), np.nan)]).astype(np.float32)
    with pytest.raises(ValueError, match="NaN or Inf"):
        matroot.inv_root_info(torch.from_numpy(a), 2, method="minimax", rtol=1e-2,
                              steps="fixed")
    res = matroot.inv_root_info(torch.from_numpy(a), 2, method="minimax", rtol=1e-2,
                                steps="fixed", verdict="device")
    assert res.converged.tolist() == [True, False]


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("method", ["minimax", "newton_db", "coupled_newton"])
def test_fixed_steps_keep_the_promise(method, p):
    """Converged means within rtol of the float64 oracle, over the adversarial spectra,
    κ up to past what rtol can certify, n from 1 up, loose and tight targets."""
    rng = np.random.default_rng(p)
    for family in (*ADVERSARIAL_FAMILIES, "geometric", "tiny_one"):
        for n in (1, 2, 3, 4, 17, 64):
            for kappa in (1e1, 1e4, 1e6):
                a = family_stack(family, rng, (3,), n, kappa).astype(np.float32) \
                    if n > 1 else np.full((3, 1, 1), 1 / kappa, dtype=np.float32)
                for rtol in (1e-3, 5e-3, 0.1, 0.5):
                    res = matroot.inv_root_info(a, p, method=method, rtol=rtol, steps="fixed")
                    err = relative_error(np.asarray(res.root, dtype=np.float64),
                                         oracle_inv_root(a.astype(np.float64), p))
                    bad = np.asarray(res.converged) & ~(err <= rtol)
                    assert not bad.any(), (family, n, kappa, rtol, err[bad])


def test_the_first_step_runs_before_any_stop_test():
    """Issue 36: minimax, p = 1, tol = 0.1, spectrum (1e-5, 1, …, 1): the start I/s was
    already within tol in the Frobenius norm, the loop stopped before its first step and
    the root I/s (error 1.0) came back converged."""
    rng = np.random.default_rng(0)
    n = 256
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    lam = np.ones(n)
    lam[0] = 1e-5
    a = ((q * lam) @ q.T).astype(np.float32)[None]
    for method in ("minimax", "newton_db", "coupled_newton"):
        res = matroot.inv_root_info(a, 1, method=method, tol=0.1)
        err = relative_error(np.asarray(res.root, dtype=np.float64),
                             oracle_inv_root(a.astype(np.float64), 1))
        assert int(res.iterations[0]) >= 1
        assert not (bool(res.converged[0]) and err[0] > 0.1), (method, err)


def test_inv_root_warns_of_a_fixed_step_failure_read_with_the_verdict():
    """The host verdict's count of failures reached inv_root's warning without the mask
    it names the total from (UnboundLocalError instead of a ConvergenceWarning)."""
    a = np.stack([np.eye(4), np.diag([1.0, 1.0, 1.0, 1e-12])]).astype(np.float32)
    with pytest.warns(matroot.ConvergenceWarning, match="1 of 2 matrices"):
        matroot.inv_root(a, 2, method="minimax", rtol=1e-2, steps="fixed")


def test_steps_fixed_says_what_it_needs():
    a = np.eye(4, dtype=np.float32)[None]
    with pytest.raises(ValueError, match="rtol="):
        matroot.inv_root_info(a, 2, method="minimax", steps="fixed")
    with pytest.raises(ValueError, match="fixed-step rule"):
        matroot.inv_root_info(a, 2, method="evd", rtol=1e-2, steps="fixed")
    with pytest.raises(ValueError, match="tol= or max_iter="):
        matroot.inv_root_info(a, 2, method="minimax", rtol=1e-2, tol=1e-3, steps="fixed")


def test_fixed_steps_on_every_backend(backend):
    a = family_stack("geometric", np.random.default_rng(0), (2,), 16, 1e3).astype(np.float32)
    res = matroot.inv_root_info(backend.asarray(a), 4, method="minimax", rtol=1e-2,
                                steps="fixed")
    err = relative_error(to_numpy(res.root), oracle_inv_root(a.astype(np.float64), 4))
    assert np.all(to_numpy(res.converged)) and np.all(err <= 1e-2)
    device = matroot.inv_root_info(backend.asarray(a), 4, method="minimax", rtol=1e-2,
                                   steps="fixed", verdict="device")
    assert np.array_equal(to_numpy(device.root), to_numpy(res.root))


@pytest.mark.parametrize("verdict", ["host", "device"])
def test_fixed_steps_across_the_float32_range(verdict):
    """The root is unscaled by ``(m·scale)^(-1/p)`` formed without λmax = m·scale, which
    overflows for entries near float32's largest while the root does not (a root from
    λmax^(-1/p) came back 0 and converged there); a p = 1 root below the normal range
    is not converged (and warns with the host verdict)."""
    eye = np.eye(8)
    for size in (3e38, 1e-30):
        a = np.stack([size * eye, eye]).astype(np.float32)
        for p in (1, 2, 4):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                res = matroot.inv_root_info(torch.from_numpy(a), p, rtol=1e-2,
                                            method="minimax", steps="fixed", verdict=verdict)
            err = relative_error(res.root.double().numpy(),
                                 oracle_inv_root(a.astype(np.float64), p))
            overflows = p == 1 and size > 1
            assert res.converged.tolist() == [not overflows, True], (size, p)
            assert np.all((err[1:] if overflows else err) <= 1e-2), (size, p, err)
            warned = any(issubclass(w.category, matroot.ConvergenceWarning) for w in caught)
            assert warned == (overflows and verdict == "host"), (size, p)


@pytest.mark.parametrize("p", [2, 4])
def test_the_host_verdict_completes_what_it_read(p):
    """The host verdict reads one gate and forms the mask and the untrusted roots'
    infinite estimates only where some matrix failed: every field then matches the
    device verdict's, which forms them always (no fallback re-solve: the two verdicts
    re-solve differently)."""
    rng = np.random.default_rng(5)
    good = family_stack("geometric", rng, (2,), 24, 1e3).astype(np.float32)
    # κ past what 5e-3 certifies (1.7e5 at p = 2), inside what the steps reach: trusted
    near = family_stack("geometric", rng, (1,), 24, 1.1e5 * p).astype(np.float32)
    a = np.concatenate([good[:1], -np.eye(24, dtype=np.float32)[None], near, good[1:]])
    options = dict(rtol=5e-3, method="minimax", steps="fixed", fallback=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host = matroot.inv_root_info(torch.from_numpy(a), p, **options)
    device = matroot.inv_root_info(torch.from_numpy(a), p, verdict="device", **options)
    for field in ("root", "converged", "error_estimate", "residual", "lambda_max"):
        np.testing.assert_array_equal(getattr(host, field).numpy(),
                                      getattr(device, field).numpy(), err_msg=field)
    assert host.converged.tolist() == [True, False, False, True]
    assert float(host.error_estimate[1]) == math.inf  # indefinite: not trusted
    assert math.isfinite(float(host.error_estimate[2]))  # trusted, beyond its target


def test_the_estimate_bounds_the_symmetric_first_order_estimate():
    """The product check's estimate takes ‖R·X‖_F for ‖sym(R·X)‖_F: never lower than the
    verify_root formula, and equal where R and X commute."""
    from matroot.certify.product_check import growth_slope, product_check

    rng = np.random.default_rng(7)
    n, p = 16, 2
    a = family_stack("geometric", rng, (3,), n, 1e2)
    exact = oracle_inv_root(a, p)
    noise = rng.standard_normal((3, n, n)) * 1e-4
    for x in (exact, exact + noise + np.swapaxes(noise, -1, -2)):
        check = product_check(a, x, p, unit_roundoff=2.0 ** -53)
        r = x @ a @ x - np.eye(n)
        rho = np.linalg.norm(r, axis=(-2, -1))
        rx = r @ x
        sym = np.linalg.norm(rx + np.swapaxes(rx, -1, -2), axis=(-2, -1)) / 2
        formula = sym / (p * np.linalg.norm(x, axis=(-2, -1))) * (1 + growth_slope(p) * rho)
        assert np.all(check.estimate >= formula * (1 - 1e-9))
        assert np.all(check.estimate <= 10 * formula + 1e-15)
