"""Red-team findings on matroot.testing and the command line, each pinned by a test that
failed before its fix: what a user testing their own solver, or running the CLI on odd
but plausible arguments, met."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from matroot.cli import main
from matroot.testing import (
    accuracy_tolerance,
    check_inv_root_solver,
    oracle_inv_root,
    relative_error,
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


# --- the command line ------------------------------------------------------------------

def one_line_error(capsys, *argv) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("verb", ["report", "plots"])
@pytest.mark.parametrize("content, fragment", [
    ("{bad", "not a readable JSON file"),        # was a JSONDecodeError traceback
    ('{"a": 1}', "not a solver benchmark's results"),  # was exit 0 with empty summaries
    ("[[3, 4]]", "not a solver benchmark's results"),
])
def test_bench_redraw_refuses_what_is_not_a_solvers_json(tmp_path, capsys, verb, content,
                                                         fragment):
    path = tmp_path / "results.json"
    path.write_text(content)
    assert fragment in one_line_error(capsys, "bench", verb, str(path), "--out",
                                      str(tmp_path / "out"))
    assert not (tmp_path / "out" / "summary.md").exists()


def test_bench_report_reads_a_solvers_json(tmp_path, capsys):
    path = tmp_path / "solvers.json"
    path.write_text(json.dumps({"schema": "matroot.bench.solvers/1", "config": {}}))
    assert main(["bench", "report", str(path)]) == 0
    assert (tmp_path / "summary.md").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["demo", "--p", "inf", "--no-plot"], "--p must be a finite number > 0"),  # was exit 0
    (["demo", "--eps", "inf", "--no-plot"], "--eps must be a finite number > 0"),
    (["bench", "solvers", "--smoke", "--kappa", "inf"], "--kappa must be a finite number"),
])
def test_infinite_options_are_refused_before_any_work(capsys, argv, fragment):
    assert fragment in one_line_error(capsys, *argv)


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


@pytest.mark.parametrize("preset, n, batches", [
    ("smoke", 1, (2,)),      # was (2097152,): minutes of a "seconds" preset
    ("quick", 2, (8,)),
    ("full", 64, (512,)),  # the full run keeps its memory-filling default
])
def test_quick_presets_keep_their_scale_for_other_sizes(preset, n, batches):
    from matroot.cli import build_parser
    from matroot.cli.bench import solvers_config

    argv = ["bench", "solvers", *([] if preset == "full" else [f"--{preset}"]),
            "--sizes", str(n)]
    assert solvers_config(build_parser().parse_args(argv)).batches[n] == batches


def test_a_case_that_cannot_be_drawn_is_the_callers_error_not_the_solvers():
    # Before: "eigh_reference fails the 'namespace' property: ValueError: ..." for a
    # device numpy does not have (or jax without float64), blaming a correct solver.
    with pytest.raises(ValueError, match="cuda"):
        check_inv_root_solver(eigh_reference, device="cuda", max_examples=3)


def test_a_zero_result_is_graded_by_accuracy_not_as_an_asymmetry():
    # Before: ‖X − Xᵀ‖/‖X‖ = 0/0 made the 'symmetric' property report "error nan".
    with pytest.raises(AssertionError, match="fails the 'accuracy' property"):
        check_inv_root_solver(lambda a, p, eps: a * 0, max_examples=10)


@pytest.mark.parametrize("text", ["", ",", " , "])
def test_plan_refuses_empty_shapes(text):
    from matroot.optim.distributed.cluster_sizing import parse_shapes

    with pytest.raises(ValueError, match="--shapes is empty"):
        parse_shapes(text)


def test_looped_eigh_baseline_runs_on_array_api_strict():
    """``matroot bench solvers --backends array_api_strict`` indexed a[i], which
    array-api-strict refuses for a 3-D array."""
    xp = pytest.importorskip("array_api_strict")
    from matroot.bench.contenders import eigh_root_batched, eigh_root_loop

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
