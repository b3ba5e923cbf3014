"""Issue 26: jitted solves and the optax Shampoo step must not hang (jaxlib deadlocks
on concurrent Choleskys), and the step compiles once.

jaxlib 0.10 can deadlock when independent batched LAPACK custom calls (Cholesky)
of one program run at once on a 2-core CPU; matroot's traced certificate ran
several. Each call now stays small enough that jaxlib runs it without its thread
pool (:func:`matroot._xp.lapack_in_order`, issue 36). The solves and the training
steps run in a subprocess (both cores, a fresh JAX) under a watchdog, so a hang
fails the test instead of stalling the suite; the watchdog is a hang guard, never
a speed limit. The subprocesses inherit the suite's one thread and XLA level 0;
``tests/backends/test_jax_user_loop.py`` runs the user's loop with JAX's defaults.
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


#: 20 steps of the optax Shampoo step on a small MLP, roots refreshed every 5 steps;
#: prints how many programs XLA compiled while the 20 steps ran.
OPTAX_SCRIPT = textwrap.dedent("""
    import jax, jax.monitoring, jax.numpy as jnp, optax
    from matroot.optim.optax import shampoo

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(k1, (16, 32)) / 4, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, 1)) / 6}
    x = jax.random.normal(k3, (64, 16))
    batch = (x, jnp.sin(x[:, :1]))

    def loss_fn(params, batch):
        hidden = jnp.tanh(batch[0] @ params["w1"] + params["b1"])
        return jnp.mean((hidden @ params["w2"] - batch[1]) ** 2)

    opt = shampoo(1e-2, precondition_frequency=5, root_method="newton_db")
    state = jax.block_until_ready(opt.init(params))

    @jax.jit
    def train_step(params, state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    compiles = []
    def count(event, _seconds, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(count)
    for _ in range(20):
        params, state, loss = train_step(params, state, batch)
    jax.block_until_ready((params, state))
    jax.monitoring.unregister_event_duration_listener(count)
    assert bool(jnp.isfinite(loss)), loss
    print("compiles", len(compiles))
""")


def _run_under_watchdog(script: str, what: str) -> str:
    """``script``'s stdout; the test fails if it hangs past the watchdog or errs."""
    try:
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=WATCHDOG_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} hung for {WATCHDOG_SECONDS} s (issue 26: concurrent "
                    "LAPACK calls in jaxlib)")
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_jitted_solves_finish_under_a_watchdog():
    assert _run_under_watchdog(SCRIPT, "jitted solves").endswith("done")


def test_twenty_optax_steps_finish_and_the_step_compiles_once():
    pytest.importorskip("optax")
    out = _run_under_watchdog(OPTAX_SCRIPT, "20 optax Shampoo steps")
    assert out.splitlines()[-1] == "compiles 1", out


def test_lapack_calls_stay_off_the_thread_pool_under_jit():
    """The compiled solve's Choleskys each factor a stack small enough that jaxlib
    runs it on the calling thread (an optimization barrier between them, the
    earlier fix, was removed by XLA before scheduling: it ordered nothing)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import matroot

    from test_jax_user_loop import _lapack_calls

    a = jnp.asarray(np.stack([np.eye(64) * 2.0] * 4), dtype=jnp.float32)
    text = jax.jit(lambda x: matroot.inv_root_info(x, 4, method="coupled_newton")
                   ).lower(a).compile().as_text()
    calls = _lapack_calls(text)
    assert any(target.endswith("potrf_ffi") for target, _, _ in calls), calls
    assert all(batch == 1 or batch * 10 * n**3 < 200_000 for _, batch, n in calls), calls
