"""Issue 36: a call that cannot do what was asked says so, or picks what can.

- ``method="auto"`` for JAX without float64 (``jax_enable_x64`` off) on a CPU: evd's
  float32 eigh meets the table only at κ ≲ 12·p and cannot retry in float64, so
  auto picks a matmul method there; for a real p (evd the only method) it warns.
- An ``rtol`` below the rounding ``u·κ/p`` of the compute dtype: the matrices it
  hits come back converged=False with a ConvergenceWarning naming the fixes
  (eagerly; under jit κ is known only on the device: no warning, documented).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import matroot
from matroot import ConvergenceWarning


def _stack(b: int, n: int, kappa: float, seed: int = 0) -> np.ndarray:
    """``b`` float32 SPD matrices with eigenvalues geometric from 1/κ to 1."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((b, n, n)))
    lam = np.geomspace(1.0 / kappa, 1.0, n)
    return ((q * lam) @ np.swapaxes(q, -1, -2)).astype(np.float32)


@pytest.fixture
def x64_off():
    """JAX with float64 off, as a user has it by default (the suite turns it on)."""
    jax = pytest.importorskip("jax")
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", False)
    yield jax
    jax.config.update("jax_enable_x64", before)


def test_auto_under_jit_without_x64_converges(x64_off):
    """Issue 36's user: jitted, x64 off, a Shampoo-like κ. auto chose float32 evd,
    which returned converged=False for every matrix and no warning."""
    jax = x64_off
    import jax.numpy as jnp

    a = jnp.asarray(_stack(4, 32, 1e4))
    result = jax.jit(lambda x: matroot.inv_root_info(x, 4))(a)
    assert result.method != "evd"
    assert bool(jnp.all(result.converged)), result.error_estimate


def test_auto_rule_without_float64(x64_off):
    import jax.numpy as jnp
    from array_api_compat import array_namespace

    from matroot.solvers.auto import CPU_METHOD, NO_FLOAT64_METHOD

    a = jnp.eye(4, dtype=jnp.float32)
    xp = array_namespace(a)
    assert matroot.choose_method(xp, a, 4) == NO_FLOAT64_METHOD != CPU_METHOD
    assert matroot.choose_method(xp, a, 0.5) == "evd"  # the only method for a real p
    with pytest.warns(ConvergenceWarning, match="jax_enable_x64"):
        result = x64_off.jit(lambda x: matroot.inv_root_info(x, 0.5))(jnp.asarray(_stack(2, 8, 10)))
    assert result.method == "evd"


def test_auto_with_float64_keeps_evd_on_a_cpu():
    jnp = pytest.importorskip("jax.numpy")
    from array_api_compat import array_namespace

    import jax

    if not jax.config.read("jax_enable_x64"):
        pytest.skip("the suite runs JAX with x64 on")
    a = jnp.eye(4, dtype=jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert matroot.choose_method(array_namespace(a), a, 4) == "evd"


@pytest.mark.parametrize("method", ["minimax", "newton_db"])
def test_an_rtol_below_the_rounding_floor_warns_and_names_the_fixes(method):
    """rtol = 1e-3 at κ ≈ 7e5 in float32 (u·κ/p ≈ 2e-2): 0 of 32 converged, silently."""
    a = _stack(32, 32, 7e5)
    with pytest.warns(ConvergenceWarning) as caught:
        result = matroot.inv_root_info(a, 2, method=method, rtol=1e-3)
    assert not result.converged.any()
    text = " ".join(str(w.message) for w in caught)
    for fix in ("compute_dtype='float64'", "fallback='evd'", "looser rtol"):
        assert fix in text, text
    # Each named fix certifies these matrices.
    assert matroot.inv_root_info(a, 2, method=method, rtol=1e-3, fallback="evd").converged.all()
    assert matroot.inv_root_info(a, 2, method=method, rtol=1e-3,
                                 compute_dtype="float64").converged.all()


def test_a_certifiable_rtol_does_not_warn():
    a = _stack(8, 32, 1e2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = matroot.inv_root_info(a, 2, method="minimax", rtol=1e-3)
    assert result.converged.all()


def test_an_uncertifiable_rtol_warns_for_eager_jax():
    jnp = pytest.importorskip("jax.numpy")
    a = jnp.asarray(_stack(4, 16, 7e5))
    with pytest.warns(ConvergenceWarning, match="below what float32 can certify"):
        result = matroot.inv_root_info(a, 2, method="newton_db", rtol=1e-3)
    assert not bool(jnp.any(result.converged))
