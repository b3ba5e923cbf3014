"""inv_root under ``jax.jit``: the accuracy table, batch independence, bad input, x64.

The eager JAX backend runs through the ``backend`` fixture with the other
backends (an eager call compiles itself: one ``jax.jit`` per shape and options);
these tests trace the same calls and compare them with the op-by-op path that
``jax.disable_jit()`` runs, whose loops check on the host. Under tracing the
solver loops are ``lax.while_loop``s and the minimax / chebyshev coefficients come from tables
indexed on the device, so nothing here may read a value back to the host.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import matroot

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from matroot.testing import oracle_inv_root, relative_error  # noqa: E402
from rounding import relative_distance, rounding_tolerance  # noqa: E402
from accuracy_cases import CASES, KAPPAS, table_problem, target  # noqa: E402


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def jit_info(p, **options):
    """``inv_root_info`` compiled with ``jax.jit`` (p and options static)."""
    return jax.jit(lambda a: matroot.inv_root_info(a, p, **options))


def _every_kappa(with_eps, p):
    """The accuracy table's problems for every κ in one stack, with one ridge for all:
    a Gram-like problem with ridge ``eps_κ`` is scaled so that the shared ``eps``
    gives it the same κ (every solver here is scale-invariant)."""
    problems = [table_problem(kappa, 32, with_eps=with_eps, seed=int(kappa) % 97 + p)
                for kappa in KAPPAS]
    eps = problems[0][1]
    stack = np.concatenate([a * (eps / e if e else 1.0) for a, e in problems])
    return stack, eps, np.repeat(KAPPAS, [a.shape[0] for a, _ in problems])


#: Compiling costs seconds per (method, p, dtype) on two cores: every (method, p) in
#: float32, and in float64 the p that exercises most of a method's traced code (the
#: square-root stages of p = 4; p = 2 for chebyshev, whose float64 rows are the
#: tightest). Every κ shares one compiled call. The eager accuracy table covers
#: every combination on JAX (tests/accuracy/test_accuracy_table.py).
FLOAT64_JIT_P = {"chebyshev": 2}
JIT_CASES = ([(m, p, "float32") for m, p in CASES]
             + [(m, p, "float64") for m, p in CASES if p == FLOAT64_JIT_P.get(m, 4)])


@pytest.mark.parametrize("method,p,dtype", JIT_CASES)
def test_accuracy_table_under_jit(method, p, dtype):
    with_eps = method in ("chebyshev", "minimax")  # under jit their lower bound is eps
    stack, eps, kappas = _every_kappa(with_eps, p)
    x = jnp.asarray(stack, dtype=dtype)
    res = jit_info(p, method=method, eps=eps)(x)
    assert res.method == method
    errors = relative_error(np.asarray(res.root), oracle_inv_root(np.asarray(x), p, eps))
    for kappa in KAPPAS:
        mine = kappas == kappa
        err, converged = errors[mine], np.asarray(res.converged)[mine]
        tol = target(method, dtype, kappa, p)
        if tol is None or (method == "chebyshev" and kappa > 1e2):
            assert np.all(err[converged] <= (tol or 0.5)), (kappa, err, converged)
            continue
        assert np.all(converged), (kappa, np.asarray(res.residual)[mine])
        assert np.all(err <= tol), f"κ={kappa:.0e}: max error {err.max():.2e} > {tol:.0e}"


@pytest.mark.parametrize("method", ["evd", "newton_db", "coupled_newton", "minimax",
                                    "chebyshev"])
def test_jit_matches_eager(method):
    """Same schedules, so the same roots up to rounding; both meet the table."""
    kappa, n = 1e3, 16
    a, eps = table_problem(kappa, n, with_eps=True, seed=3)
    x = jnp.asarray(a, dtype=jnp.float32)
    with jax.disable_jit():
        eager = matroot.inv_root_info(x, 4, method=method, eps=eps)
    traced = jit_info(4, method=method, eps=eps)(x)
    assert_same_solve(traced, eager, oracle_inv_root(a, 4, eps), "float32", kappa, n,
                      target(method, "float32", kappa, 4))


def assert_same_solve(first, second, oracle, dtype, kappa, n, table_tol):
    """Two programs ran one solve (jit vs. op by op, or another batch size): both
    converge and meet the table; where rounding did not move a convergence check (same
    iteration counts) the roots agree to rounding, else each is held to the table alone."""
    assert np.all(np.asarray(first.converged)) and np.all(np.asarray(second.converged))
    for res in (first, second):
        assert np.all(relative_error(np.asarray(res.root), oracle) <= table_tol)
    same_steps = np.asarray(first.iterations) == np.asarray(second.iterations)
    distance = relative_distance(first.root, second.root)
    assert np.all(distance[same_steps] <= rounding_tolerance(dtype, kappa, n)), distance


def test_an_eager_call_compiles_once_per_shape_and_keeps_the_eager_checks(monkeypatch):
    import matroot.roots.stack_solve as stack_solve

    traces = []
    solve = stack_solve.solve_stack
    monkeypatch.setattr(stack_solve, "solve_stack",
                        lambda a, **o: traces.append(1) or solve(a, **o))
    kappa, n = 1e2, 12
    a, _ = table_problem(kappa, n, with_eps=False, seed=5)
    x = jnp.asarray(a, dtype=jnp.float32)
    first = matroot.inv_root_info(x, 4, method="newton_db", tol=1e-4)
    again = matroot.inv_root_info(x + 0, 4, method="newton_db", tol=1e-4)
    assert len(traces) == 1                         # traced once, then the compiled call
    # Same compiled program, same inputs: bitwise equality is what XLA gives here.
    assert bool(jnp.all(first.converged)) and bool(jnp.all(first.root == again.root))
    with jax.disable_jit():
        eager = matroot.inv_root_info(x, 4, method="newton_db", tol=1e-4)
    assert len(traces) == 2                         # op by op: Python runs again
    assert_same_solve(first, eager, oracle_inv_root(a, 4, 0.0), "float32", kappa, n,
                      target("newton_db", "float32", kappa, 4))
    bad = np.asarray(x).copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        matroot.inv_root(jnp.asarray(bad), 4, method="newton_db")
    with pytest.warns(matroot.ConvergenceWarning, match="did not converge"):
        matroot.inv_root(x, 4, method="newton_db", max_iter=1)


@pytest.mark.parametrize("method", ["evd", "coupled_newton", "minimax"])
def test_nonfinite_matrix_isolated_under_jit(method):
    """No host check under jit: the bad matrix comes back NaN, not converged, and
    cannot move the others: bit-identical to the same program run with a good matrix
    in its place, and equal to rounding to a batch without it (another program)."""
    kappa, n = 1e2, 8
    a, eps = table_problem(kappa, n, with_eps=True, seed=7)
    poisoned = a.copy()
    poisoned[1, 0, 3] = np.nan
    compiled = jit_info(2, method=method, eps=eps)
    bad = compiled(jnp.asarray(poisoned))
    # One compiled program, the same inputs in rows 0 and 2: bitwise is XLA's to give.
    same_program = compiled(jnp.asarray(a))
    assert np.asarray(bad.converged).tolist() == [True, False, True]
    assert np.all(np.isnan(np.asarray(bad.root[1])))
    np.testing.assert_array_equal(np.asarray(bad.root)[[0, 2]],
                                  np.asarray(same_program.root)[[0, 2]])
    smaller = jit_info(2, method=method, eps=eps)(jnp.asarray(a[[0, 2]]))
    good = SimpleNamespace(**{field: np.asarray(getattr(bad, field))[[0, 2]]
                              for field in ("root", "converged", "iterations")})
    assert_same_solve(good, smaller, oracle_inv_root(a[[0, 2]], 2, eps), "float64", kappa,
                      n, target(method, "float64", kappa, 2))


def test_inv_root_under_jit_returns_the_root_without_host_reads():
    x = jnp.asarray(np.diag([16.0, 81.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        root = jax.jit(lambda a: matroot.inv_root(a, 4, method="newton_db"))(x)
    np.testing.assert_allclose(np.diag(np.asarray(root)), [0.5, 1 / 3], rtol=1e-10)


def test_fixed_steps_under_jit():
    a, _ = table_problem(1e4, 16, with_eps=False, seed=2)
    x = jnp.asarray(a, dtype=jnp.float32)
    res = jit_info(2, method="newton_db", tol=0.0, max_iter=5)(x)
    assert np.asarray(res.iterations).tolist() == [5, 5, 5]
    assert not np.any(np.asarray(res.converged))


@pytest.mark.parametrize("bad,error,match", [
    (np.ones(3), ValueError, "at least 2 dimensions"),
    (np.ones((2, 3)), ValueError, "square"),
    (np.ones((2, 2), dtype=np.int32), TypeError, "integer"),
])
def test_bad_input_raises_at_trace_time(bad, error, match):
    with pytest.raises(error, match=match):
        jax.jit(lambda a: matroot.inv_root(a, 2))(jnp.asarray(bad))


@pytest.mark.parametrize("method", ["minimax", "chebyshev"])
def test_lower_bound_estimated_on_the_device_under_jit(method):
    """eps = 0: the Lanczos λmin estimate runs on the device (no host read), and
    the converged roots meet the table."""
    a, _ = table_problem(1e3, 16, with_eps=False, seed=5)
    x = jnp.asarray(a, dtype=jnp.float32)
    res = jit_info(2, method=method)(x)
    err = relative_error(np.asarray(res.root), oracle_inv_root(np.asarray(x), 2, 0.0))
    converged = np.asarray(res.converged)
    assert converged.any(), np.asarray(res.residual)
    assert np.all(err[converged] <= target(method, "float32", 1e3, 2)), err


def test_evd_without_x64_stays_float32_and_says_where_it_falls_short():
    """JAX without x64 has no float64 to retry in: evd keeps float32, and a matrix
    whose float32 root misses the table is converged=False, not silently wrong."""
    with jax.enable_x64(False):
        good = jnp.asarray(np.diag([16.0, 81.0]), dtype=jnp.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            root = matroot.inv_root(good, 4, method="evd")
        assert root.dtype == jnp.float32
        np.testing.assert_allclose(np.diag(np.asarray(root)), [0.5, 1 / 3], rtol=1e-6)
        a, _ = table_problem(1e7, 32, with_eps=False, seed=4)
        res = matroot.inv_root_info(jnp.asarray(a, dtype=jnp.float32), 4, method="evd")
        with jax.enable_x64(True):
            err = relative_error(np.asarray(res.root, dtype=np.float64),
                                 oracle_inv_root(a.astype(np.float32), 4, 0.0))
        converged = np.asarray(res.converged)
        assert np.all(err[converged] <= target("evd", "float32", 1e6, 4)), (err, converged)
        with pytest.raises(ValueError, match="jax_enable_x64"):
            matroot.inv_root(good, 4, method="evd", compute_dtype="float64")


@pytest.mark.parametrize("method", ["coupled_newton", "minimax"])
def test_16bit_matmuls_under_jit(method):
    """float16 operands under jit: converged, and as accurate as the documented
    float16 level (minimax keeps ZY and q·Z in float32 there), like the op-by-op run."""
    a, eps = table_problem(1e3, 32, with_eps=True, seed=11)
    x = jnp.asarray(a, dtype=jnp.float32)
    options = dict(method=method, eps=eps, matmul_dtype="float16")
    traced = jit_info(2, **options)(x)
    with jax.disable_jit():
        eager = matroot.inv_root_info(x, 2, **options)
    ref = oracle_inv_root(np.asarray(x), 2, eps)
    for res in (traced, eager):
        assert np.all(np.asarray(res.converged))
        assert np.all(relative_error(np.asarray(res.root), ref) <= 2e-3)


def _gram_stack(seed: int, b: int = 2, n: int = 5, ridge: float = 0.1) -> np.ndarray:
    g = np.random.default_rng(seed).standard_normal((b, n, n + 2))
    return g @ np.swapaxes(g, -1, -2) + ridge * np.eye(n)


@pytest.mark.parametrize("name", ["p", "eps", "rtol"])
def test_traced_options_name_the_static_fix(name):
    """A traced rtol was "ValueError: rtol must be a real number in (0, 1], got
    JitTracer" (it is one), a traced p "p must be a real number, got
    DynamicJaxprTracer", a traced eps "pass float(eps)", which a traced value refuses."""
    options = {"p": 2, "method": "newton_db"}

    def fn(x, value):
        return matroot.inv_root(x, **{**options, name: value})

    value = {"p": 2.0, "eps": 1e-3, "rtol": 1e-3}[name]
    with pytest.raises(TypeError, match=rf"{name} is traced.*static_argnames"):
        jax.jit(fn)(jnp.asarray(_gram_stack(0)), value)

