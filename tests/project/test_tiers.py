"""The slow-test table of tests/tiers.py: its rules match what they say, and no rule is
left behind by a renamed test file."""

from __future__ import annotations

from pathlib import Path

from tiers import SLOW_TESTS, slow_reason

TESTS = Path(__file__).resolve().parents[1]


def test_a_rule_names_its_cases_and_nothing_else():
    jax_cell = ("tests/accuracy/test_accuracy_table.py::"
                "test_accuracy_table[jax-evd-1-kappa1e+02-float32]")
    numpy_cell = jax_cell.replace("[jax-", "[numpy-")
    assert slow_reason(jax_cell, set()) is not None
    assert slow_reason(numpy_cell, set()) is None
    # "[" is literal, not a character class: [coupled_newton] stays quick.
    assert slow_reason("tests/backends/test_jax.py::test_jit_matches_eager[newton_db]", set())
    assert slow_reason("tests/backends/test_jax.py::test_jit_matches_eager[coupled_newton]",
                       set()) is None


def test_the_compile_marker_makes_a_test_slow():
    assert slow_reason("tests/test_any.py::test_something", {"compile"}) is not None
    assert slow_reason("tests/test_any.py::test_something", {"parametrize"}) is None


def test_every_rule_names_an_existing_test_file_and_gives_a_reason():
    for pattern, reason in SLOW_TESTS:
        path = pattern.split("::", 1)[0]
        assert (TESTS.parent / path).is_file(), f"{pattern}: no file {path}"
        assert reason.strip(), pattern
