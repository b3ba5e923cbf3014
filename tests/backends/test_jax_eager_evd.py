"""An eager ``inv_root(method="evd")`` on a ``jax.Array``: the first call a JAX user
makes, with x64 on and off.

It ran op by op: each of its ~120 small operations (the regularisation, the float32
eigh and its screen, the float64 retry, the judgement) was compiled on first use, 122
programs and 20-40 s on a two-core CPU per new shape (87 with x64 off). It is one
compiled program now, whose float32 screen and float64 retry decide on the device what
the op-by-op call decides on the host (``jax.disable_jit``): the same matrices are
redone, so every root agrees with the op-by-op one to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from rounding import relative_distance, rounding_tolerance

import matroot
from matroot.testing import oracle_inv_root, relative_error, spd_stack

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
from test_jax_compiles import lowered  # noqa: E402

#: Far below the 122 (x64) and 87 (x64 off) programs the op-by-op call lowered: the
#: solve and the few host reads around it (the finiteness test, the warnings' flags).
MOST_PROGRAMS = 12


def _stack(n=16):
    """Matrix 0 well conditioned (float32's eigh suffices), matrix 1 at κ = 1e5 (it
    needs float64), matrix 2 like 0."""
    rng = np.random.default_rng(7)
    parts = [spd_stack(rng, (1,), n, kappa)[0] for kappa in (10.0, 1e5, 30.0)]
    return np.concatenate(parts).astype(np.float32)


@pytest.mark.parametrize("x64", [True, False], ids=["x64", "x64_off"])
def test_an_eager_evd_is_one_program_that_redoes_only_what_float32_cannot(x64):
    """The op-by-op call's decisions (which matrices float64 redoes) are compared with
    this one's matrix by matrix in ``solvers/test_evd.py``'s JAX case (slow: it runs
    op by op); here the outcome: only matrix 1 redone, the others as if alone."""
    host = _stack()
    with jax.enable_x64(x64):
        a = jnp.asarray(host)
        with lowered() as count:
            info = matroot.inv_root_info(a, 4, method="evd")
            jax.block_until_ready(info)
        alone = matroot.inv_root(a[::2], 4, method="evd")
    assert count[0] <= MOST_PROGRAMS, count[0]
    distance = relative_distance(np.asarray(info.root)[::2], np.asarray(alone))
    assert np.all(distance <= rounding_tolerance("float32", 1e2, host.shape[-1])), distance
    error = relative_error(np.asarray(info.root, dtype=np.float64), oracle_inv_root(host, 4))
    if x64:
        # Matrix 1 was redone in float64: float32's eigh cannot reach the table at
        # κ = 1e5, float64's leaves only the float32 rounding of the root.
        assert bool(np.all(np.asarray(info.converged))), info.converged
        assert np.all(error <= 1e-5), error
    else:
        # No float64 to redo it in: matrix 1 says it falls short, the others converge.
        assert np.asarray(info.converged).tolist() == [True, False, True]
        assert error[0] <= 1e-5 and error[2] <= 1e-5, error
