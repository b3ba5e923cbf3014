"""Issue 26: jitted solves must not hang (jaxlib deadlocks on concurrent Choleskys).

jaxlib 0.10 can deadlock when independent batched LAPACK custom calls (Cholesky)
of one program run at once on a 2-core CPU; matroot's traced certificate ran
several. They are now chained by data dependencies
(:func:`matroot._xp.lapack_in_order`). The solves run in a subprocess under a
watchdog, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax")

#: Far above the ~20 s the script takes on a loaded 2-core machine (compiles
#: included); only a hang reaches it.
WATCHDOG_SECONDS = 240

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, matroot
    rng = np.random.default_rng(0)
    g = rng.standard_normal((4, 16, 16))
    a = jnp.asarray(g @ g.transpose(0, 2, 1) / 16 + 0.5 * np.eye(16), dtype=jnp.float32)
    solve = jax.jit(lambda x: matroot.inv_root_info(x, 4, method="coupled_newton"))
    for _ in range(100):
        result = solve(a)
        jax.block_until_ready(result.root)
    assert bool(jnp.all(result.converged))
    for method in ("newton_db", "evd"):
        info = jax.jit(lambda x, m=method: matroot.inv_root_info(x, 2, method=m, eps=1e-3))
        for _ in range(5):
            out = info(a)
            jax.block_until_ready(out.root)
        assert bool(jnp.all(out.converged)), method
    print("done")
""")


def test_jitted_solves_finish_under_a_watchdog():
    try:
        run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                             timeout=WATCHDOG_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"jitted solves hung for {WATCHDOG_SECONDS} s (issue 26: concurrent "
                    "LAPACK calls in jaxlib)")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("done")


def test_lapack_calls_are_chained_under_jit():
    """The traced program orders its Choleskys: each one's input passes an
    optimization barrier with the previous one's output."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import matroot

    a = jnp.asarray(np.stack([np.eye(8) * 2.0] * 2), dtype=jnp.float32)
    text = jax.jit(lambda x: matroot.inv_root_info(x, 4, method="coupled_newton")
                   ).lower(a).as_text()
    assert "optimization_barrier" in text
