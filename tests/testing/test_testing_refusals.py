"""matroot.testing refuses what it cannot grade, by name: bad arguments to the oracles,
stacks, strategies and conformance checks, each pinned by a test that failed before its
fix (what a user testing their own solver met)."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import matroot
from matroot.testing import (
    accuracy_tolerance,
    check_inv_root_solver,
    oracle_inv_root,
    relative_error,
    scaled_spd_stack,
    shampoo_factors,
    spd_stack,
    spd_stacks,
)

torch = pytest.importorskip("torch")


def eigh_reference(a, p, eps):
    """Float64 eigh, back in the input's dtype: correct for every p > 0."""
    x = np.asarray(a, dtype=np.float64)
    lam, q = np.linalg.eigh(x + eps * np.eye(x.shape[-1]))
    return ((q * lam[..., None, :] ** (-1.0 / p)) @ np.swapaxes(q, -1, -2)).astype(a.dtype)


def adds_ridge_in_place(a, p, eps):
    a += eps * np.eye(a.shape[-1], dtype=a.dtype)  # the bug: the caller's array changes
    return eigh_reference(a, p, 0.0)


# --- check_inv_root_solver -------------------------------------------------------------

def test_a_solver_that_mutates_its_input_is_named_for_it():
    # Before: caught only by chance, reported as a 'scale_covariance' error.
    with pytest.raises(AssertionError, match="fails the 'namespace' property: the solver "
                                             "changed its input a in place"):
        check_inv_root_solver(adds_ridge_in_place, max_examples=20)


@pytest.mark.parametrize("dtype, p", [("float64", 0.5), ("float32", (0.5, 0.75))])
def test_a_correct_solver_passes_for_roots_below_one(dtype, p):
    # Before: (A + eps·I)^(-2) of the extreme-scale cases overflowed float64 (a NaN error
    # for an exact solver); the cases now stay where the root is representable too.
    check_inv_root_solver(eigh_reference, p=p, dtype=dtype, method="evd", max_examples=25,
                          skip=("nan_isolation",))


@pytest.mark.parametrize("kwargs, message", [
    ({"p": 0}, "finite roots > 0"),
    ({"p": ()}, "finite roots > 0"),
    ({"p": (2, float("inf"))}, "finite roots > 0"),
    ({"p": 0.05}, "roots beyond the range of float32"),
    ({"max_examples": 0}, "whole number >= 1"),
    ({"max_examples": 2.5}, "whole number >= 1"),
])
def test_roots_the_check_cannot_grade_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_inv_root_solver(eigh_reference, **kwargs)


def test_numpy_scalar_types_name_the_dtype():
    assert accuracy_tolerance(np.float32, 100.0) == accuracy_tolerance("float32", 100.0)
    check_inv_root_solver(eigh_reference, dtype=np.float64, method="evd", max_examples=3)


# --- oracles ---------------------------------------------------------------------------

def test_oracles_read_torch_bfloat16_and_tensors_that_require_grad():
    a = np.diag([4.0, 16.0])
    want = np.diag([0.5, 0.25])
    assert np.array_equal(oracle_inv_root(torch.tensor(a, dtype=torch.bfloat16), 2), want)
    assert relative_error(want, torch.tensor(want, dtype=torch.bfloat16)) == 0.0
    assert relative_error(want, torch.tensor(want, requires_grad=True)) == 0.0


@pytest.mark.parametrize("x, ref", [
    (np.ones((2, 1)), np.eye(2)),                 # was 1.0: broadcast into a plausible error
    (np.ones((3, 2, 2)), np.ones((2, 3, 2, 2))),  # was a (2, 3) array of zeros
    (np.ones(3), np.ones(3)),                     # was numpy's AxisError
])
def test_relative_error_refuses_shapes_that_do_not_match(x, ref):
    with pytest.raises(ValueError, match="shape"):
        relative_error(x, ref)


def test_relative_error_still_takes_one_reference_for_a_stack():
    stack = np.stack([np.eye(2), 2 * np.eye(2)])
    assert relative_error(stack, np.eye(2)).tolist() == [0.0, 1.0]


def test_oracle_names_bad_arguments():
    with pytest.raises(ValueError, match="order must be > 0"):
        oracle_inv_root(np.eye(2), 0)
    with pytest.raises(ValueError, match=r"\(\.\.\., n, n\)"):
        oracle_inv_root(np.ones(3), 2)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="not a spectral family"):  # was KeyError: 'gram'
        spd_stack(rng, (2,), 3, 10.0, spread="gram")
    with pytest.raises(ValueError, match="at least 1"):  # was a stack with λmax = 2
        spd_stack(rng, (2,), 3, 0.5)


def test_an_empty_batch_is_refused_by_name():
    # Before: numpy's "zero-size array to reduction operation maximum" from deep inside.
    with pytest.raises(ValueError, match=r"batch_shape \(0,\) holds no matrices"):
        spd_stacks(batch_shape=(0,))

    @settings(max_examples=5, deadline=None)
    @given(spd_stacks(batch_shape=st.just((2, 0)), n=2))
    def draws(case):
        pass

    with pytest.raises(ValueError, match=r"batch_shape \(2, 0\) holds no matrices"):
        draws()


def test_check_polar_solver_refuses_zero_examples():
    # 0 used to become hypothesis's profile default (100 examples) without a word.
    from matroot.testing import check_polar_solver

    with pytest.raises(ValueError, match="whole number >= 1"):
        check_polar_solver(lambda g: g, max_examples=0)


def test_check_polar_solver_grades_the_result_dtype():
    # Before: the result went to float64 NumPy unchecked, so a solver answering float32
    # input in float64 passed.
    from matroot.testing import check_polar_solver

    def svd_polar_in_float64(g):
        u, _, vt = np.linalg.svd(g.astype(np.float64), full_matrices=False)
        return u @ vt

    with pytest.raises(AssertionError, match=r"fails the 'accuracy' property: result "
                                             r"\(module, shape, dtype\)"):
        check_polar_solver(svd_polar_in_float64, m=(2, 4), n=(2, 4), max_examples=10)


def test_a_case_that_cannot_be_drawn_is_the_callers_error_not_the_solvers():
    # Before: "eigh_reference fails the 'namespace' property: ValueError: ..." for a
    # device numpy does not have (or jax without float64), blaming a correct solver.
    with pytest.raises(ValueError, match="cuda"):
        check_inv_root_solver(eigh_reference, device="cuda", max_examples=3)


def test_a_zero_result_is_graded_by_accuracy_not_as_an_asymmetry():
    # Before: ‖X − Xᵀ‖/‖X‖ = 0/0 made the 'symmetric' property report "error nan".
    with pytest.raises(AssertionError, match="fails the 'accuracy' property"):
        check_inv_root_solver(lambda a, p, eps: a * 0, max_examples=10)


def test_looped_eigh_baseline_runs_on_array_api_strict():
    """``python -m bench solvers --backends array_api_strict`` indexed a[i], which
    array-api-strict refuses for a 3-D array."""
    xp = pytest.importorskip("array_api_strict")
    from matroot.cli.contenders import eigh_root_batched, eigh_root_loop

    a = xp.asarray(np.stack([np.diag([4.0, 16.0]), np.diag([1.0, 9.0])]))
    looped = eigh_root_loop(xp, a, 2)
    batched = eigh_root_batched(xp, a, 2)
    assert len(looped) == 2
    np.testing.assert_allclose(np.asarray(looped[1]), np.asarray(batched[1, ...]), rtol=1e-12)
    np.testing.assert_allclose(np.diag(np.asarray(looped[0])), [0.5, 0.25], rtol=1e-12)


def test_assert_inv_root_close_names_a_list_and_the_fix():
    from matroot.testing import SPDCase, assert_inv_root_close

    case = SPDCase(np.diag([1.0, 100.0]), eps=0.0, family="geometric")
    with pytest.raises(TypeError, match=r"got list: pass np\.asarray"):
        assert_inv_root_close([[1.0, 0.0], [0.0, 0.1]], case, 2)


@pytest.mark.parametrize("make, error, match", [
    (lambda: spd_stack(np.random.default_rng(0), (1,), 3, 10.0, lam_max=-1.0),
     ValueError, "lam_max"),
    (lambda: spd_stack(np.random.default_rng(0), (1,), 3, 10.0, lam_max=0.0),
     ValueError, "lam_max"),
    (lambda: spd_stack(np.random.default_rng(0), (1,), 3, 10.0, lam_max=np.inf),
     ValueError, "lam_max"),
    (lambda: spd_stack(np.random.default_rng(0), (1,), 3, np.inf), ValueError, "finite"),
    (lambda: scaled_spd_stack(2, 3, np.inf), ValueError, "finite"),
    (lambda: scaled_spd_stack(2, 3, 10.0, dtype=np.int32), TypeError, "real floating"),
    (lambda: shampoo_factors(0, 3), ValueError, "batch must be >= 1"),
])
def test_test_helpers_refuse_what_is_no_spd_stack(make, error, match):
    """matroot.testing, called as a user's own tests call it: ``lam_max <= 0`` built a
    negative (semi)definite "SPD" stack and ``lam_max=inf`` one of NaN, silently;
    ``kappa=inf`` died in NumPy ("Geometric sequence cannot include zero"); an
    integer ``dtype`` truncated the stack to mostly zeros; ``shampoo_factors(0, n)``
    raised IndexError."""
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kappa=np.inf), ValueError, "finite"),
    (dict(kappa=(1.0, np.inf)), ValueError, "finite"),
    (dict(batch_shape=(-1,)), ValueError, "negative"),
    (dict(xp="torch"), TypeError, "not an array namespace"),
])
def test_spd_stacks_names_bad_arguments_when_built(kwargs, error, match):
    """``spd_stacks(kappa=inf)`` raised "OverflowError: cannot convert float infinity
    to integer" and ``kappa=(1, inf)``, ``batch_shape=(-1,)`` or ``xp="torch"``
    failed only inside the user's hypothesis test, as an ExceptionGroup or an
    AttributeError on a string."""
    pytest.importorskip("hypothesis")
    from matroot.testing import spd_stacks

    with pytest.raises(error, match=match):
        spd_stacks(**kwargs)


@pytest.mark.parametrize("call, error, match", [
    (lambda t: t.check_inv_root_solver("evd", p=2), TypeError, "solver must be a function"),
    (lambda t: t.check_polar_solver(3), TypeError, "solver must be a function"),
    (lambda t: t.check_polar_solver(matroot.polar, kappa=(1.0, np.inf)), ValueError, "finite"),
    (lambda t: t.polar_case(np.random.default_rng(0), (1,), 3, 2, 0.5), ValueError, "kappa"),
    (lambda t: t.polar_case(np.random.default_rng(0), (1,), 3, 2, 10.0, scale=0.0),
     ValueError, "scale"),
])
def test_solver_checks_and_polar_cases_name_bad_arguments(call, error, match):
    """``check_inv_root_solver("evd")`` (a method's name for a function) failed the
    solver's 'namespace' property with "'str' object is not callable";
    ``check_polar_solver(kappa=(1, inf))`` died with OverflowError; ``polar_case``
    took κ < 1, and ``scale=0`` paired a zero matrix with an orthogonal "oracle"
    factor (matroot maps a zero matrix to zero)."""
    pytest.importorskip("hypothesis")
    import matroot.testing as testing

    with pytest.raises(error, match=match):
        call(testing)
