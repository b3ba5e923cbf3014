"""matroot.testing: the strategies draw what they say, the oracles are right, and the
conformance check passes a correct solver and names the property a faulty one breaks."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from matroot.testing import (
    ACCURACY_TABLE,
    ADVERSARIAL_FAMILIES,
    FAMILIES,
    PROPERTIES,
    SPDCase,
    accuracy_tolerance,
    assert_inv_root_close,
    check_inv_root_solver,
    spd_stacks,
)
from matroot.testing.strategies import available_namespaces, safe_exponent_range

FEW = settings(max_examples=8, deadline=None)


@FEW
@given(case=spd_stacks(n=(2, 10), kappa=(10.0, 1e5), dtype="float64"), data=st.data())
def test_kappa_within_range_in_float64(case, data):
    kappa = case.kappa
    assert np.all((kappa >= 10.0) & (kappa <= 1e5)), (case.family, kappa)
    assert case.lam.dtype == np.float64 and case.a.dtype == np.float64


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_hits_kappa_and_keeps_its_shape(family):
    @FEW
    @given(case=spd_stacks(n=(2, 6), kappa=(1e2, 1e3), families=[family],
                           batch_shape=(2,)))
    def check(case):
        assert case.family == family
        assert case.batch_shape == (2,)
        assert np.all((case.kappa >= 1e2) & (case.kappa <= 1e3))
        assert (1 <= case.n <= 2) if family == "small" else (2 <= case.n <= 6)
        a = case.a
        np.testing.assert_array_equal(a, np.swapaxes(a, -1, -2))

    check()


def _exact_case(family, **kw):
    return spd_stacks(families=[family], n=(2, 6), kappa=(1e2, 1e4), batch_shape=(), **kw)


@FEW
@given(case=_exact_case("gram"))
def test_gram_family_is_singular_plus_ridge(case):
    lam_top = case.lam[..., -1]
    assert case.eps > 0
    assert np.all(np.abs(case.lam[..., 0]) <= 1e-12 * lam_top)  # rank deficient


@FEW
@given(case=_exact_case("repeated"))
def test_repeated_family_repeats_eigenvalues(case):
    distinct = np.unique(np.round(case.lam / case.lam[..., -1], 9))
    assert len(distinct) <= min(3, case.n)  # the ends and the geometric middle


@FEW
@given(case=_exact_case("isolated_top", eps=0.0))
def test_isolated_top_sits_over_a_bulk(case):
    lam = case.lam / case.lam[-1]
    if case.n > 2:  # λ1 = 1 over a bulk repeated at λ2 in [0.5, 0.99]
        assert 0.5 <= lam[-2] <= 0.99
        assert np.sum(np.isclose(lam, lam[-2], rtol=1e-9)) >= (case.n - 2) - case.n // 8


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scale_extremes_reach_the_dtype_range(dtype):
    low, high = safe_exponent_range(dtype, 1.0)

    @FEW
    @given(case=spd_stacks(families=["scale_extremes"], dtype=dtype, kappa=(1.0, 1e3),
                           eps=0.0))
    def check(case):
        assert case.dtype == dtype
        top = np.log2(case.lam[..., -1].max())
        assert top >= high - 1 or top <= low + 10 + 1
        assert np.all(np.isfinite(case.a))

    check()


@pytest.mark.parametrize("name", ["numpy", "array_api_strict", "torch", "jax"])
def test_namespaces(name):
    xp = available_namespaces().get(name)
    if xp is None:
        pytest.skip(f"{name} is not installed")

    @settings(max_examples=3, deadline=None)
    @given(case=spd_stacks(xp=xp, dtype="float32", n=(2, 4)))
    def check(case):
        assert type(case.a).__module__.split(".")[0] == type(xp.asarray(0.0)).__module__.split(
            ".")[0]
        assert case.dtype == "float32"

    check()


def test_sizes_cover_the_range_and_kappa_one_allows_1x1():
    sizes = set()

    @settings(max_examples=40, deadline=None)
    @given(case=spd_stacks(n=(1, 3), kappa=(1.0, 1e2), families=["geometric"]))
    def record(case):
        sizes.add(case.n)
        assert case.n > 1 or np.all(case.kappa == 1.0)

    record()
    assert sizes == {1, 2, 3}


@FEW
@given(case=spd_stacks(n=st.sampled_from([5, 12]), kappa=(10.0, 1e6),
                       families=ADVERSARIAL_FAMILIES, batch_shape=(2,)))
def test_sizes_from_a_strategy(case):
    assert case.n in (5, 12) and case.family in ADVERSARIAL_FAMILIES


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown spectrum families"):
        spd_stacks(families=["gaussian"])
    with pytest.raises(ValueError, match="float32"):
        spd_stacks(dtype="float16")
    with pytest.raises(ValueError, match="n >= 2"):
        spd_stacks(n=1, kappa=10.0)
    with pytest.raises(ValueError, match="unknown properties"):
        check_inv_root_solver(lambda a, p, eps: a, skip=("symmetry",))


@FEW
@given(case=spd_stacks(n=(1, 6), kappa=(1.0, 1e3)), p=st.sampled_from([0.5, 1, 2.5, 4]))
def test_oracles_invert_each_other(case, p):
    n = case.n
    reg = np.asarray(case.a) + case.eps * np.eye(n)
    inv_root, root = case.inv_root(p), case.root(p)
    assert np.allclose(inv_root @ root, np.eye(n), atol=1e-8 * np.max(case.kappa))
    if float(p).is_integer():
        power = np.linalg.matrix_power(root, int(p))
        assert np.allclose(power, reg, rtol=1e-8, atol=1e-9 * np.abs(reg).max())


def test_assert_inv_root_close_names_the_worst_matrix():
    a = np.stack([np.diag([1.0, 4.0]), np.diag([1.0, 400.0])]).astype(np.float32)
    case = SPDCase(a, eps=0.0, family="geometric")
    good = case.inv_root(2).astype(np.float32)
    assert_inv_root_close(good, case, 2)
    bad = good.copy()
    bad[1, 1, 1] *= 1.1
    with pytest.raises(AssertionError, match=r"matrix \(1,\).*'geometric'.*κ=400.*float32:"
                                             r" error 0\.00\d+ > tolerance 0\.001"):
        assert_inv_root_close(bad, case, 2)
    assert accuracy_tolerance("float32", 400.0, 2) == 1e-3


# --- the conformance check on good and faulty solvers ----------------------------------

def eigh_reference(a, p, eps):
    """Float64 eigh, back in the input's dtype: the solver every property holds for."""
    x = np.asarray(a, dtype=np.float64)
    lam, q = np.linalg.eigh(x + eps * np.eye(x.shape[-1]))
    return ((q * lam[..., None, :] ** (-1.0 / p)) @ np.swapaxes(q, -1, -2)).astype(a.dtype)


def newton_schulz_10(a, p, eps):
    """DASH's fixed schedule: 10 coupled Newton–Schulz steps after Frobenius scaling."""
    n = a.shape[-1]
    a = a + eps * np.eye(n, dtype=a.dtype)
    s = np.linalg.norm(a, axis=(-2, -1))[..., None, None]
    y, z = a / s, np.broadcast_to(np.eye(n, dtype=a.dtype), a.shape)
    for _ in range(10):
        e = 1.5 * np.eye(n, dtype=a.dtype) - 0.5 * (z @ y)
        y, z = y @ e, e @ z
    return z / np.sqrt(s)


def ignores_ridge(a, p, eps):
    return eigh_reference(a, p, 0.0)


def overflows_at_large_scale(a, p, eps):
    # Normalising by a sum of squares taken in the input's dtype: inf beyond ~1e19 in float32.
    reg = a + eps * np.eye(a.shape[-1], dtype=a.dtype)
    s = np.sqrt(np.sum(reg * reg, axis=(-2, -1), keepdims=True))
    return (eigh_reference(reg / s, p, 0.0) * s ** (-1.0 / p)).astype(a.dtype)


def not_symmetric(a, p, eps):
    x = eigh_reference(a, p, eps)
    return x @ (np.eye(a.shape[-1], dtype=a.dtype) + 1e-3 * np.triu(np.ones_like(x), 1))


def shares_one_scale(a, p, eps):
    # Scales the whole batch by one bound (its largest entry), then 14 Newton–Schulz steps.
    if p != 2:
        return eigh_reference(a, p, eps)
    s = np.max(np.abs(a)) + eps
    return (newton_schulz_14(a / s, eps / s) * s ** -0.5).astype(a.dtype)


def newton_schulz_14(a, eps):
    n = a.shape[-1]
    y = (a + eps * np.eye(n, dtype=a.dtype)) / n
    z = np.broadcast_to(np.eye(n, dtype=a.dtype), a.shape)
    for _ in range(14):
        e = 1.5 * np.eye(n, dtype=a.dtype) - 0.5 * (z @ y)
        y, z = y @ e, e @ z
    return z / np.sqrt(n)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_check_passes_the_eigh_reference(dtype):
    check_inv_root_solver(eigh_reference, dtype=dtype, p=(1, 2, 2.5, 4), method="evd",
                          max_examples=8)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the faulty solvers overflow
@pytest.mark.parametrize("solver,prop,kwargs", [
    (newton_schulz_10, "accuracy", {"p": 2, "kappa": (1e3, 1e4)}),
    (ignores_ridge, "accuracy", {}),
    (overflows_at_large_scale, "extreme_scale", {}),
    (not_symmetric, "symmetric", {}),
    (shares_one_scale, "batch_independence", {"p": 2, "kappa": (1.0, 10.0),
                                               "skip": ("nan_isolation", "extreme_scale")}),
], ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_check_names_the_broken_property(solver, prop, kwargs):
    with pytest.raises(AssertionError) as info:
        check_inv_root_solver(solver, max_examples=25, **kwargs)
    message = str(info.value)
    assert f"{solver.__name__} fails the {prop!r} property" in message
    assert "SPDCase(" in message  # hypothesis's shrunk counterexample
    assert prop in PROPERTIES


# --- the docs page and the README table ------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_testing_page_examples_run():
    result = doctest.testfile(str(ROOT / "docs" / "testing.rst"), module_relative=False,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0


def test_readme_table_is_the_accuracy_table():
    """The README states the table that matroot.testing.ACCURACY_TABLE holds."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {"float32, `evd`": [("evd", "float32")],
            "float32, `newton_db` / `coupled_newton` / `minimax`": [("iterative", "float32")],
            "float32, `chebyshev`": [("chebyshev", "float32")],
            "float64, all": [(row, "float64") for row in ("evd", "iterative", "chebyshev")]}
    for label, keys in rows.items():
        line = next(ln for ln in readme.splitlines() if ln.startswith(f"| {label} |"))
        cells = [c.strip().split(" ")[0] for c in line.strip("|").split("|")[1:]]
        stated = tuple(float(c) if c[0].isdigit() else None for c in cells)
        for key in keys:
            table = ACCURACY_TABLE[key]
            assert all(t is None or t == s for t, s in zip(table, stated)), (label, key)


def test_hypothesis_is_optional(monkeypatch):
    code = ("import sys, matroot, matroot.testing; "
            "assert 'hypothesis' not in sys.modules, 'import matroot loaded hypothesis'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    import matroot.testing

    monkeypatch.setitem(sys.modules, "hypothesis", None)
    with pytest.raises(ImportError, match=r'pip install "matroot\[testing\]"'):
        matroot.testing.spd_stacks  # noqa: B018


def test_default_sizes_reach_past_eight():
    """Issue 21: a solver wrong for every n > 8 used to pass with the defaults."""

    def wrong_beyond_eight(a, p, eps):
        root = eigh_reference(a, p, eps)
        return root if a.shape[-1] <= 8 else 1.5 * root

    with pytest.raises(AssertionError, match="accuracy"):
        check_inv_root_solver(wrong_beyond_eight, max_examples=25)
