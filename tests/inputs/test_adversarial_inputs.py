"""Inputs nobody tried: narrowed compute dtypes, layouts, option types, nasty spectra,
batch neighbours.

The regression tests name what broke; the hypothesis hunts at the end draw what the
other searches do not (``tests/accuracy/test_adversarial_search.py`` draws the methods,
families and stopping modes): exact repeats, diagonal and permuted matrices, a tiny
negative eigenvalue, n = 1, scales by 2^k across the dtype's range, on NumPy and torch,
with the options that change the verdict's path (``compute_dtype`` across the input's,
``steps="fixed"``, ``certificate="randomized"``, ``verdict="device"``, 16-bit matmuls,
``fallback``), and random neighbours that must leave a matrix's bits alone.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import matroot
from matroot.solvers import SOLVERS
from matroot.solvers.registry import accuracy_target
from matroot.testing import oracle_inv_root, relative_error
from matroot.testing.spectra import family_stack
from tiers import examples


def _quiet(call, *args, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return call(*args, **options)


@pytest.mark.parametrize("method", ["evd", "minimax", "coupled_newton"])
@pytest.mark.parametrize("options", [{}, {"rtol": 1e-2}], ids=["table", "rtol"])
def test_float64_input_computed_in_float32_counts_the_rounding_of_the_input(method, options):
    """float64 input with ``compute_dtype="float32"``: the check sees only the stack
    rounded to float32, which moves the root by up to ``‖A − fl(A)‖_F/(p·λmin)``.
    evd's float64 retry of the rounded stack came back converged 0.1–0.2 off at
    κ = 1e7 (p = 1, 2; estimates 1e-7) and 1.8e-2 off at κ = 8e5 (table: 1e-3), and
    50× an ``rtol`` of 1e-2."""
    rng = np.random.default_rng(0)
    a = np.concatenate([family_stack(family, rng, (4,), 16, kappa)
                        for family in ("kms", "tridiagonal", "flat_bulk")
                        for kappa in (1e4, 8e5, 1e7)])
    a = (a + np.swapaxes(a, -1, -2)) / 2
    lam = np.linalg.eigvalsh(a)
    kappa = lam[:, -1] / lam[:, 0]
    for p in (1, 2):
        res = _quiet(matroot.inv_root_info, a, p, method=method, compute_dtype="float32",
                     **options)
        error = relative_error(res.root, oracle_inv_root(a, p, refine=True))
        target = options.get("rtol", accuracy_target(method, "float32", p, kappa))
        converged = np.asarray(res.converged)
        assert np.all(error[converged] <= np.broadcast_to(target, error.shape)[converged]), \
            (p, error[converged].max())
        assert np.all(res.error_estimate[converged] <= 0.5), "an estimate that cannot hold"



@pytest.mark.parametrize("method", ["evd", "minimax", "chebyshev"])
@pytest.mark.parametrize("value, eps", [(9e-44, 0.0), (3e-42, 0.0), (1e-39, 0.0),
                                        (1e-6 * 2.0**-133, 1e-3 * 2.0**-133)])
def test_float64_input_rounded_to_a_float32_subnormal_is_not_taken_as_exact(method, value,
                                                                            eps):
    """A float64 entry (or eps) near 1e-44 becomes a float32 subnormal with a relative
    error of 1e-3 or more: chebyshev came back converged 3.6e-3 off (table 1e-3) from
    the hunt below, the input's rounding cast to float32 before scaling having
    underflowed, and 3.1e-3 off with such an eps (scaled in float32)."""
    a = np.array([[[value]]])
    res = _quiet(matroot.inv_root_info, a, 2, method=method, compute_dtype="float32", eps=eps)
    error = relative_error(res.root, oracle_inv_root(a, 2, eps))
    target = accuracy_target(method, "float32", 2, 1.0)
    assert not res.converged[0] or error[0] <= target, (error, res.error_estimate)

@pytest.mark.parametrize("flag", ["no", "False", None, 0, 1.0])
@pytest.mark.parametrize("call", [matroot.inv_root_info, matroot.polar_info],
                         ids=["inv_root", "polar"])
def test_check_finite_takes_only_a_bool(call, flag):
    """``check_finite="no"`` read as True (a string's truth value) and ``None`` as
    False: a TypeError now says what it takes."""
    a = np.eye(3)[None]
    with pytest.raises(TypeError, match="check_finite must be True or False"):
        call(a, 2, check_finite=flag) if call is matroot.inv_root_info else \
            call(a, check_finite=flag)
    call(a, 2, check_finite=np.bool_(False)) if call is matroot.inv_root_info else \
        call(a, check_finite=np.bool_(False))


@pytest.mark.parametrize("method", ["newton_db", "coupled_newton", "minimax"])
def test_fixed_steps_of_a_float64_torch_inverse_computed_in_float32(method):
    """``steps="fixed"``, p = 1, float64 torch input, ``compute_dtype="float32"``: the
    range test clipped the float32 root norm to float64's largest number, which torch
    refuses (RuntimeError: value cannot be converted to type float without overflow)."""
    torch = pytest.importorskip("torch")
    a = torch.diag(torch.tensor([2.0, 4.0, 8.0], dtype=torch.float64))[None]
    res = matroot.inv_root_info(a, 1, method=method, rtol=1e-4, steps="fixed",
                                compute_dtype="float32")
    assert res.root.dtype == torch.float64 and bool(res.converged.all())
    np.testing.assert_allclose(np.diag(res.root[0].numpy()), [0.5, 0.25, 0.125], rtol=1e-4)


# The hunts. ---------------------------------------------------------------------------

#: Constructions the spectrum families of matroot.testing do not make.
KINDS = ("diagonal", "permuted", "repeated", "cluster", "outlier", "geometric",
         "tiny_negative", "equal")


def _nasty(kind: str, rng: np.random.Generator, n: int, kappa: float) -> np.ndarray:
    if kind in ("diagonal", "permuted"):
        d = np.diag(np.geomspace(1 / kappa, 1, n)[rng.permutation(n)])
        order = rng.permutation(n)
        return d if kind == "diagonal" else d[np.ix_(order, order)]
    lam = {"repeated": np.where(np.arange(n) < n // 2, 1 / kappa, 1.0),
           "cluster": np.r_[1 / kappa, 1 + 1e-6 * rng.standard_normal(n - 1)],
           "outlier": np.r_[np.full(n - 1, 1 / kappa), 1.0],
           "geometric": np.geomspace(1 / kappa, 1, n),
           "tiny_negative": np.r_[-1e-9 / kappa, np.geomspace(1 / kappa, 1, n)[1:]],
           "equal": np.ones(n)}[kind][:n]
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (q * lam) @ q.T


def _host(x) -> np.ndarray:
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def _as_backend(values: np.ndarray, backend: str):
    if backend == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_numpy(np.ascontiguousarray(values))
    return values


@st.composite
def _calls(draw):
    method = draw(st.sampled_from(sorted(SOLVERS)))
    spec = SOLVERS[method]
    p = draw(st.sampled_from([q for q in (1, 2, 3, 4, 8, 0.5) if spec.root_orders.accepts(q)]))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    options: dict = {}
    if draw(st.booleans()):
        options["rtol"] = draw(st.sampled_from(
            [3e-2, 1e-3] if dtype == "float32" else [1e-4, 1e-8]))
        if method in FIXED_METHODS and draw(st.booleans()):
            options["steps"] = "fixed"
    if spec.iterative and "steps" not in options and draw(st.booleans()):
        options["certificate"] = "randomized"
    if draw(st.integers(0, 3)) == 0:
        options["compute_dtype"] = "float64" if dtype == "float32" else "float32"
    elif (dtype == "float32" and spec.iterative and method != "chebyshev"
          and "steps" not in options and draw(st.integers(0, 3)) == 0):
        options["matmul_dtype"] = "float16"
    if "steps" not in options and draw(st.integers(0, 3)) == 0:
        options["verdict"] = "device"
    if draw(st.integers(0, 3)) == 0:
        options["fallback"] = "evd"
    return dict(method=method, p=p, dtype=dtype, options=options,
                backend=draw(st.sampled_from(["numpy", "torch"])),
                n=draw(st.integers(1, 10)), kappa=10.0 ** draw(st.floats(0, 7)),
                kind=draw(st.sampled_from(KINDS)),
                log2_scale=draw(st.integers(-100, 100) if dtype == "float32"
                                else st.integers(-900, 900)),
                ridge=draw(st.sampled_from([None, 0.0, 1e-6, 1e-3])),
                seed=draw(st.integers(0, 2**31 - 1)))


FIXED_METHODS = ("minimax", "newton_db", "coupled_newton")
#: What ``converged`` may still be off by beyond the row's target: the cast of a root
#: computed in a wider dtype back to the input's (one unit roundoff).
CAST_BACK = {"float32": 2.0**-24, "float64": 0.0}
MATMUL_ROW = (5e-3, 2e-2, 5e-2)  # float16 matmuls (docs/convergence.rst)


def _hunt_once(call):
    rng = np.random.default_rng(call["seed"])
    dtype, p, scale = call["dtype"], call["p"], 2.0 ** call["log2_scale"]
    values = (np.stack([_nasty(call["kind"], rng, call["n"], call["kappa"])
                        for _ in range(2)]) * scale).astype(dtype)
    options = dict(call["options"])
    if call["ridge"] is not None:
        options["eps"] = call["ridge"] * scale
    try:
        res = _quiet(matroot.inv_root_info, _as_backend(values, call["backend"]), p,
                     method=call["method"], **options)
    except ValueError as err:  # an rtol or eps the call cannot take, said so
        assert "rtol" in str(err) or "eps" in str(err), err
        return
    converged = _host(res.converged).astype(bool)
    if not converged.any():
        return
    exact = values.astype(np.float64) / scale
    exact = (exact + np.swapaxes(exact, -1, -2)) / 2
    ridge = options.get("eps", 0.0) / scale
    lam = np.linalg.eigvalsh(exact) + ridge
    assert np.all(lam[converged, 0] > 0), "converged without a real inverse root"
    kappa = lam[:, -1] / lam[:, 0]
    error = relative_error(_host(res.root).astype(np.float64) * scale ** (1.0 / p),
                           _quiet(oracle_inv_root, exact, p, ridge, refine=True))
    work = options.get("compute_dtype", dtype)
    if "rtol" in options:
        target = np.full(2, options["rtol"])
    elif "matmul_dtype" in options:
        target = np.array([MATMUL_ROW[int(np.searchsorted([1e2, 1e4], k))] for k in kappa])
    else:
        target = accuracy_target(call["method"], work, p, kappa)
    target = target + (CAST_BACK[dtype] if work == "float64" else 0.0)
    assert np.all(error[converged] <= target[converged]), (call, error, target)


@settings(max_examples=examples(40), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(call=_calls())
def test_converged_means_right_on_nasty_constructions(call):
    _hunt_once(call)


@pytest.mark.slow
@settings(max_examples=examples(600), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(call=_calls())
def test_converged_means_right_on_nasty_constructions_long(call):
    _hunt_once(call)


NEIGHBOURS = ("nan", "one_nan", "inf", "indefinite", "zero", "huge", "tiny", "kappa_1e9",
              "nonsymmetric")
FIELDS = ("root", "converged", "iterations", "error_estimate", "residual", "matmuls",
          "lambda_max", "repaired")


def _neighbour(kind: str, rng, good: np.ndarray) -> np.ndarray:
    n, dtype = good.shape[-1], good.dtype
    big, small = (1e30, 1e-40) if dtype == np.float32 else (1e300, 1e-310)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    with np.errstate(all="ignore"):
        matrix = {"nan": np.full((n, n), np.nan), "one_nan": np.where(
                      np.eye(n, k=n - 1, dtype=bool), np.nan, good),
                  "inf": np.full((n, n), np.inf),
                  "indefinite": (q * np.r_[-1.0, np.ones(n - 1)]) @ q.T,
                  "zero": np.zeros((n, n)), "huge": np.eye(n) * big,
                  "tiny": np.eye(n) * small,
                  "kappa_1e9": (q * np.geomspace(1e-9, 1, n)) @ q.T,
                  "nonsymmetric": good + 10 * rng.standard_normal((n, n))}[kind]
    return matrix.astype(dtype)


def _isolation_once(call, kind, where):
    rng = np.random.default_rng(call["seed"])
    n, dtype = call["n"], call["dtype"]
    q, _ = np.linalg.qr(rng.standard_normal((3, n, n)))
    goods = ((q * np.geomspace(1e-3, 1, n)) @ np.swapaxes(q, -1, -2)).astype(dtype)
    options = {k: v for k, v in call["options"].items() if k != "steps"}

    def solve(stack):
        return _quiet(matroot.inv_root_info, _as_backend(stack, call["backend"]), call["p"],
                      method=call["method"], check_finite=False, **options)

    try:
        bad = solve(np.insert(goods, where, _neighbour(kind, rng, goods[0]), axis=0))
    except ValueError as err:
        assert "rtol" in str(err), err
        return
    good = solve(np.insert(goods, where, goods[(where + 1) % 3], axis=0))
    rest = [i for i in range(4) if i != where]
    changed = [f for f in FIELDS if not np.array_equal(
        _host(getattr(bad, f))[rest], _host(getattr(good, f))[rest], equal_nan=True)]
    assert not changed, (call, kind, where, changed)


@settings(max_examples=examples(8), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(call=_calls(), kind=st.sampled_from(NEIGHBOURS), where=st.integers(0, 3))
def test_a_bad_neighbour_changes_no_bits(call, kind, where):
    """Every option that changes the solve's path, on NumPy and torch: a neighbour that
    is NaN, infinite, indefinite, zero, huge, subnormal, past the table or far from
    symmetric leaves the other matrices' results bit for bit as a good one does
    (another batch size may round differently: docs/convergence.rst)."""
    _isolation_once(call, kind, where)


@pytest.mark.slow
@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(call=_calls(), kind=st.sampled_from(NEIGHBOURS), where=st.integers(0, 3))
def test_a_bad_neighbour_changes_no_bits_long(call, kind, where):
    _isolation_once(call, kind, where)


@pytest.mark.parametrize("p", [10**400, 2**1100])
def test_a_root_order_beyond_float64_is_a_value_error(p):
    """A Python int past float64's range raised OverflowError from ``float(p)``."""
    with pytest.raises(ValueError, match="beyond float64's range"):
        matroot.inv_root(np.eye(2)[None], p, method="evd")


def test_a_huge_root_order_is_named_briefly():
    """p = 1e300 (integral, so an int) was printed with its 301 digits."""
    with pytest.raises(ValueError, match=r"does not support p=1e\+300; methods that do"):
        matroot.inv_root(np.eye(2)[None], 1e300, method="newton_db")


def _layouts(a: np.ndarray) -> dict:
    padded = np.zeros((a.shape[0], 2 * a.shape[1], 2 * a.shape[2]), a.dtype)
    padded[:, ::2, ::2] = a
    frozen = a.copy()
    frozen.flags.writeable = False
    return {"fortran": np.asfortranarray(a), "negative_strides": a[::-1, ::-1].copy()[::-1, ::-1],
            "strided": padded[:, ::2, ::2], "read_only": frozen,
            "transposed_copy": np.swapaxes(np.swapaxes(a, -1, -2).copy(), -1, -2)}


@pytest.mark.parametrize("method", ["evd", "minimax", "coupled_newton"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layouts_give_the_bits_of_a_contiguous_copy(method, dtype):
    """Fortran order, negative and padded strides, read-only and stride-0 (expanded)
    stacks, NumPy and torch: the same bits as a C-contiguous copy."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.standard_normal((3, 6, 6)))
    a = ((q * np.geomspace(1e-3, 1, 6)) @ np.swapaxes(q, -1, -2)).astype(dtype)
    want = matroot.inv_root(a, 2, method=method)
    for name, view in _layouts(a).items():
        assert np.array_equal(matroot.inv_root(view, 2, method=method), want), name
    t = torch.from_numpy(a)
    views = {"expanded": t[:1].expand(3, 6, 6), "strided": torch.from_numpy(
        _layouts(a)["strided"]), "transposed": t.mT.contiguous().mT}
    for name, view in views.items():
        got = matroot.inv_root(view, 2, method=method)
        assert torch.equal(got, matroot.inv_root(view.contiguous(), 2, method=method)), name
