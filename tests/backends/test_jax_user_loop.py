"""Issue 36: a JAX user's first optax Shampoo training loop must not hang, run as the
user runs it: a fresh process, JAX's default flags and thread counts, all cores.

jaxlib 0.10's CPU LAPACK kernels split a batch into chunks on XLA's intra-op thread
pool and block the calling thread until the chunks finish; XLA runs a program's
independent operations on that same pool, so two such calls at once took both
threads of a 2-core machine and waited forever (``matroot._xp.lapack_in_order``
says more). The suite's conftest runs JAX with one thread and XLA's optimisation
level 0, so each training loop here runs in a subprocess whose environment drops
those settings, under the watchdog of ``tests/hang_guard.py``: a hang fails the test.

The structural test reads the compiled step: every LAPACK custom call it holds
is small enough that jaxlib runs it on the calling thread, without the pool.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import textwrap

import pytest
from hang_guard import HANG_GUARD_S

pytest.importorskip("jax")
pytest.importorskip("optax")

from matroot.solvers.registry import solver_names

#: Every ``root_method`` the optax Shampoo takes: the solver registry's and "auto".
ROOT_METHODS = ("auto", *solver_names())

#: The variables conftest sets (or the suite may set) that a user does not have.
SUITE_ONLY_VARIABLES = ("XLA_FLAGS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                        "MKL_NUM_THREADS", "MATROOT_TEST_THREADS")

#: A 2-layer MLP (256 → 256 → 1) trained by the chain of issue 36 for 60 steps,
#: roots refreshed every 10, each step waited for; one line per root method given.
USER_LOOP = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, optax
    from matroot.optim.optax import shampoo

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k3, (256, 256))
    y = jnp.sin(x[:, :1]) + 0.1 * x[:, 1:2]

    def loss_fn(p):
        hidden = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((hidden @ p["w2"] + p["b2"] - y) ** 2)

    for method in sys.argv[1:]:
        params = {"w1": jax.random.normal(k1, (256, 256)) / 16, "b1": jnp.zeros(256),
                  "w2": jax.random.normal(k2, (256, 1)) / 16, "b2": jnp.zeros(1)}
        opt = optax.chain(optax.clip_by_global_norm(1.0),
                          shampoo(3e-3, precondition_frequency=10, root_method=method))
        state = opt.init(params)

        @jax.jit
        def step(p, s):
            loss, g = jax.value_and_grad(loss_fn)(p)
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s, loss

        for _ in range(60):
            params, state, loss = step(params, state)
            jax.block_until_ready((params, state, loss))
        assert bool(jnp.isfinite(loss)), (method, loss)
        print("trained", method, float(loss), flush=True)
""")


def user_environment() -> dict[str, str]:
    """This process's environment without the suite's thread and XLA settings."""
    return {k: v for k, v in os.environ.items() if k not in SUITE_ONLY_VARIABLES}


def run_user_loop(methods: tuple[str, ...], watchdog_s: float = HANG_GUARD_S,
                  compile_cache: str | None = None) -> str:
    """The user's loop for ``methods`` in a fresh process; fails on a hang or an error.
    ``compile_cache``: a JAX compilation cache folder the process reads and writes."""
    env = user_environment()
    if compile_cache is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=compile_cache,
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    try:
        run = subprocess.run([sys.executable, "-c", USER_LOOP, *methods],
                             capture_output=True, text=True, timeout=watchdog_s, env=env)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the optax Shampoo loop ({methods}) hung for {watchdog_s} s under "
                    f"JAX's default flags; it had printed: {hung.stdout!r}")
    assert run.returncode == 0, run.stderr[-3000:]
    trained = [line.split()[1] for line in run.stdout.splitlines()
               if line.startswith("trained")]
    assert trained == list(methods), run.stdout
    return run.stdout


#: Far above the 20–60 s one method's loop takes on a 2-core machine (idle to
#: loaded by other work; its compile included): only a hang reaches it.
ONE_METHOD_WATCHDOG_S = 240


def test_the_user_loop_finishes_with_default_flags():
    """The quick tier's case: newton_db, as issue 36's user ran it."""
    run_user_loop(("newton_db",), watchdog_s=ONE_METHOD_WATCHDOG_S)


@pytest.mark.parametrize("attempt", range(3))
def test_the_user_loop_finishes_for_every_root_method(attempt):
    """Every root method, 60 steps each, in three fresh processes: the deadlock
    struck some runs and not others, after a root refresh (at run time, in LAPACK
    calls: not while compiling). Attempt 0 runs exactly as a user does; attempts 1
    and 2 share a JAX compilation cache (the suite's run folder, so a worker of
    its own compiles once), which hands them the same programs without the
    compiles, about half of each process's time."""
    folder = os.environ.get("MATROOT_TEST_JAX_CACHE", "off")
    cache = None if attempt == 0 or folder == "off" else os.path.join(folder, "user-loop")
    run_user_loop(ROOT_METHODS, compile_cache=cache)


def _lapack_calls(compiled_text: str) -> list[tuple[str, int, int]]:
    """(target, batch, n) of each LAPACK custom call in an XLA program's text."""
    calls = []
    for line in compiled_text.splitlines():
        target = re.search(r'custom_call_target="(lapack_\w+)"', line)
        if target:
            shape = re.search(r"= \(?[a-z0-9]+\[([0-9,]*)\]", line)
            dims = [int(d) for d in shape.group(1).split(",") if d] if shape else []
            batch = 1
            for d in dims[:-2]:
                batch *= d
            calls.append((target.group(1), batch, dims[-1] if dims else 0))
    return calls


def test_every_lapack_call_of_the_step_runs_without_the_thread_pool():
    """jaxlib 0.10 waits on its thread pool when a call's batch holds more than
    2e5 flops of work (its estimate is at most 10·n³ a matrix); the compiled step
    holds only calls below that, so none can wait on a pool another call holds."""
    import jax
    import jax.numpy as jnp
    import optax

    from matroot.optim.optax import shampoo

    params = {"w1": jnp.ones((256, 256)) / 16, "b1": jnp.zeros(256),
              "w2": jnp.ones((256, 1)) / 16}
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      shampoo(3e-3, precondition_frequency=10, root_method="newton_db"))
    state = opt.init(params)

    def step(p, s):
        g = jax.tree_util.tree_map(jnp.ones_like, p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    text = jax.jit(step).lower(params, state).compile().as_text()
    calls = _lapack_calls(text)
    assert calls, "the step should refresh its roots with LAPACK calls"
    large = [c for c in calls if c[1] > 1 and c[1] * 10 * c[2] ** 3 >= 200_000]
    assert not large, f"batched LAPACK calls jaxlib would split onto its pool: {large}"


@pytest.mark.parametrize("shape", [(100, 8, 8), (3, 64, 64), (2, 3, 40, 40), (5, 30, 10)])
def test_chunked_lapack_calls_give_the_unchunked_results(shape):
    """The chunks (many small matrices a call, or one large one) give the batched
    call's results bit for bit, eagerly and under jit, for each kernel used."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from matroot import _xp

    g = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    spd = jnp.asarray(g @ np.swapaxes(g, -1, -2) + shape[-2] * np.eye(shape[-2], dtype=np.float32))
    cases = [(jnp.linalg.cholesky, (spd,)), (jnp.linalg.eigh, (spd,)),
             (lambda m: jnp.linalg.svd(m, full_matrices=False), (jnp.asarray(g),)),
             (jnp.linalg.solve, (spd, spd[..., :2]))]
    for call, args in cases:
        expected = jax.tree_util.tree_leaves(call(*args))
        chunked = functools.partial(_xp.lapack_in_order, call)
        for run in (chunked, jax.jit(chunked)):
            got = jax.tree_util.tree_leaves(run(*args))
            assert all(np.array_equal(np.asarray(e), np.asarray(o))
                       for e, o in zip(expected, got, strict=True)), call
