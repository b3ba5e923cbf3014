"""The optimizer's root refresh (issues 35, 39): ``root_options`` carries every inv_root
keyword an optimizer can set, checked by inv_root's own checks when the optimizer is made;
a refresh certifies its roots to the optimizer's ``rtol``, by default in fixed steps
with no host read; one bad matrix in a stack keeps its previous root and counts a
failure while the others come out as they would alone; and a new user's run (torch
Shampoo, library defaults, a fresh process) trains."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hang_guard import HANG_GUARD_S

import matroot
from matroot.optim import RootOptions, ShampooConfig
from matroot.optim.shampoo_core.blocking import FactorStackShape
from matroot.optim.shampoo_core.packing import pack, unpack
from matroot.optim.shampoo_core.preconditioner import refresh_inverse_roots
from matroot.optim.shampoo_core.root_options import DEFAULT_RTOL
from matroot.testing import oracle_inv_root, relative_error
from matroot.testing.spectra import family_stack

torch = pytest.importorskip("torch")


# --- root_options: every keyword, inv_root's checks -------------------------------------

@pytest.mark.parametrize("keyword, value", [
    ("rtol", 0.0), ("rtol", 2.0), ("certificate", "maybe"), ("bound_certificate", "lucky"),
    ("steps", "some"), ("verdict", "later"), ("fallback", "eigh"), ("scaling", "trace"),
    ("tol", -1.0), ("max_iter", 0), ("compute_dtype", "float16")])
def test_root_options_refuse_what_inv_root_refuses_with_its_message(keyword, value):
    a = np.eye(2, dtype=np.float32)[None]
    with pytest.raises((ValueError, TypeError)) as by_inv_root:
        matroot.inv_root_info(a, 2, method="newton_db", **{keyword: value})
    with pytest.raises(type(by_inv_root.value)) as by_options:
        ShampooConfig(root_options={keyword: value})
    assert str(by_options.value) == str(by_inv_root.value)


def test_root_options_carry_every_keyword_an_optimizer_sets():
    options = RootOptions(rtol=5e-3, certificate="deterministic", bound_certificate="cholesky",
                          steps="fixed", verdict="device", scaling="schatten")
    config = ShampooConfig(root_method="minimax", root_options=options.keywords())
    assert config.root_options == options
    assert config.root_options.keywords()["rtol"] == 5e-3


@pytest.mark.parametrize("options, method, says", [
    ({"steps": "fixed"}, "evd", "fixed-step rule"),
    ({"steps": "fixed", "max_iter": 10}, "coupled_newton", "tol= or max_iter="),
    ({"steps": "fixed", "certificate": "randomized"}, "minimax", "certificate="),
    ({"matmul_dtype": "float16", "compute_dtype": "float64"}, "coupled_newton", "float32"),
])
def test_combinations_the_solver_refuses_fail_when_the_optimizer_is_made(options, method,
                                                                          says):
    with pytest.raises(ValueError, match=says):
        ShampooConfig(root_method=method, root_options=options)
    with pytest.raises(ValueError, match=says):
        matroot.optim.Shampoo([torch.nn.Parameter(torch.zeros(3, 3))], root_method=method,
                              root_options=options, distributed=None)


def test_the_defaults_are_a_fixed_step_solve_certified_to_rtol_on_the_device():
    factors = np.eye(8, dtype=np.float32)[None]
    for method, steps in (("coupled_newton", "fixed"), ("minimax", "fixed"),
                          ("newton_db", "fixed"), ("evd", "adaptive")):
        for no_sync in (False, True):
            kw = RootOptions().solve_keywords(factors, 4, method=method, eps=1e-8,
                                              no_sync=no_sync)
            assert (kw["rtol"], kw["steps"], kw["verdict"]) == (DEFAULT_RTOL, steps, "device")
    # An adaptive loop keeps the host verdict (it stops early) unless the step reads
    # nothing on the host.
    adaptive = RootOptions(tol=1e-4)
    assert adaptive.solve_keywords(factors, 4, method="coupled_newton", eps=0.0,
                                   no_sync=False)["verdict"] == "host"
    assert adaptive.solve_keywords(factors, 4, method="coupled_newton", eps=0.0,
                                   no_sync=True)["verdict"] == "device"


# --- one bad matrix in a refreshed stack --------------------------------------------------

N = 12
EPS = 1e-6


def _stack(bad: str | None):
    rng = np.random.default_rng(5)
    good = family_stack("geometric", rng, (3,), N, 1e3).astype(np.float32) * 1e-2
    if bad is None:
        return good
    spoiled = {"nan": np.full((N, N), np.nan), "indefinite": -np.eye(N),
               "inf": np.where(np.eye(N) > 0, np.inf, 0.0)}[bad].astype(np.float32)
    return np.concatenate([good[:1], spoiled[None], good[1:]])


def _refresh(factors, previous, options, no_sync, method):
    shape = FactorStackShape(size=N, count=factors.shape[0], root=4, dtype="float32")
    t = torch.from_numpy(factors)
    roots = pack(torch.from_numpy(previous))
    failures = torch.zeros(factors.shape[0], dtype=torch.int32)
    # Carried bounds as the optimizer keeps them: tight where known (the good
    # matrices'), unknown (+inf) for the bad one.
    finite = np.isfinite(factors).all(axis=(1, 2))
    top = np.linalg.eigvalsh(np.where(finite[:, None, None], factors, 0.0))[:, -1]
    known = finite & (top > 0)
    bounds = torch.from_numpy(np.stack([np.where(known, 1.05 * top, np.inf),
                                        np.where(known, top, 0.0)], axis=-1).astype(np.float32))
    out = refresh_inverse_roots(shape, pack(t), roots, failures, bounds, method=method,
                                eps=EPS, options=options, no_sync=no_sync)
    return unpack(out.roots, N).numpy(), out.failures.numpy()


@pytest.mark.parametrize("bad", ["nan", "indefinite", "inf"])
@pytest.mark.parametrize("options, no_sync, method, bitwise", [
    (RootOptions(), False, "coupled_newton", True),
    (RootOptions(), True, "minimax", True),
    (RootOptions(steps="adaptive"), True, "coupled_newton", True),
    # The host verdict's adaptive loop takes the carried bounds only where every bound
    # of the stack is tight: the bad matrix's unknown bound sends its neighbours to
    # bounds of their own, as certified but not the same bits.
    (RootOptions(steps="adaptive"), False, "newton_db", False),
], ids=["fixed", "fixed-minimax", "adaptive-device", "adaptive-host"])
def test_a_bad_matrix_keeps_its_root_and_counts_a_failure_and_changes_no_other(
        bad, options, no_sync, method, bitwise):
    factors = _stack(bad)
    previous = np.stack([np.eye(N, dtype=np.float32) * (k + 2) for k in range(4)])
    roots, failures = _refresh(factors, previous, options, no_sync, method)
    assert failures.tolist() == [0, 1, 0, 0]
    np.testing.assert_array_equal(roots[1], previous[1])
    if bitwise:
        alone, _ = _refresh(_stack(None), previous[[0, 2, 3]], options, no_sync, method)
        np.testing.assert_array_equal(roots[[0, 2, 3]], alone)
    exact = oracle_inv_root(factors[[0, 2, 3]].astype(np.float64) + EPS * np.eye(N), 4)
    assert np.all(relative_error(roots[[0, 2, 3]].astype(np.float64), exact)
                  <= (options.rtol or DEFAULT_RTOL))


def test_a_factor_beyond_what_rtol_can_certify_keeps_its_root():
    """κ ≈ 1e8 cannot be certified to 1e-2 in float32 (κ·u/p ≈ 1.5): the fixed-step
    solve says so, and the refresh keeps the previous root, whatever it computed."""
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((N, N)))
    ill = ((q * np.logspace(0, -8, N)) @ q.T).astype(np.float32)
    factors = np.stack([ill, _stack(None)[0]])
    previous = np.stack([np.eye(N, dtype=np.float32)] * 2)
    shape = FactorStackShape(size=N, count=2, root=4, dtype="float32")
    out = refresh_inverse_roots(shape, torch.from_numpy(factors), torch.from_numpy(previous),
                                torch.zeros(2, dtype=torch.int32), torch.zeros(2, 2),
                                method="minimax", eps=0.0, options=RootOptions(),
                                no_sync=True)
    assert out.failures.tolist() == [1, 0]
    assert torch.equal(out.roots[0], torch.from_numpy(previous[0]))


# --- what a new user runs -----------------------------------------------------------------

_USER_RUN = textwrap.dedent("""
    import math, torch, warnings
    from matroot.optim import Shampoo
    warnings.simplefilter("error")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    x = torch.randn(256, 20)
    y = torch.sin(x[:, :1] * 2) + x[:, 1:2] ** 2
    opt = Shampoo(model.parameters(), lr=3e-3, precondition_frequency=5)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    d = opt.diagnostics()
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < 0.75 * losses[0], losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert d["root_refreshes"] == 4 and d["root_failures"] == 0, d
    print("ok", losses[0], losses[-1])
""")


def test_a_new_users_shampoo_run_trains_in_a_fresh_process():
    """Library defaults, torch's default threads and flags, no conftest: 20 steps of a
    small MLP, four refreshes, finite and decreasing loss, no warning, no failed root."""
    run = subprocess.run([sys.executable, "-c", _USER_RUN], capture_output=True, text=True,
                         timeout=HANG_GUARD_S)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("ok")


# --- compiled steps ------------------------------------------------------------------------

def test_the_default_refresh_under_jax_jit_matches_the_numpy_core():
    """A fixed-step refresh traced by jax.jit (the plan is a host constant, the verdict a
    select): the same updates as the NumPy core to float32 rounding, no failed root."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    pytest.importorskip("optax")
    from matroot.optim import init, update
    from matroot.optim.optax import shampoo

    hyper = dict(block_size=8, precondition_frequency=2, root_method="minimax",
                 root_options={"rtol": 2e-2})
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((12, 8)).astype(np.float32)}
    opt = shampoo(1e-2, **hyper)
    state = opt.init({"w": jnp.asarray(params["w"])})
    step = jax.jit(opt.update)
    config = ShampooConfig(lr=1e-2, **hyper)
    core = init([params["w"]], config)
    for _ in range(4):
        g = rng.standard_normal((12, 8)).astype(np.float32)
        updates, state = step({"w": jnp.asarray(g)}, state, {"w": jnp.asarray(params["w"])})
        expected, core = update([g], core, [params["w"]], config)
        np.testing.assert_allclose(np.asarray(updates["w"]), expected[0], rtol=2e-3,
                                   atol=1e-6)
    inner = state[0]
    assert int(inner.root_refreshes) == 2
    assert sum(int(f.sum()) for f in inner.root_failures) == 0
