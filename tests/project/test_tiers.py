"""The slow-test table of tests/tiers.py: its rules match what they say, and every rule
matches a test that pytest collects, so a renamed or moved test cannot silently become
quick."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hang_guard import HANG_GUARD_S
from tiers import SLOW_TESTS, matches, slow_reason

from conftest import COLLECTED

ROOT = Path(__file__).resolve().parents[2]


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
    assert slow_reason("tests/any/test_any.py::test_something", {"compile"}) is not None
    assert slow_reason("tests/any/test_any.py::test_something", {"parametrize"}) is None


def collected_node_ids(config, files: list[str]) -> list[str]:
    """Every node id pytest collects from ``files`` (paths from the root): this session's
    collection where it took those files whole (a run of the suite or a folder), else
    ``pytest --collect-only`` of the others in a fresh process (conftest included)."""
    session = config.stash.get(COLLECTED, [])
    whole_files = not any("::" in str(arg) for arg in config.args)
    seen = {node_id.split("::", 1)[0] for node_id in session} if whole_files else set()
    rest = [f for f in files if f not in seen]
    if not rest:
        return session
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *rest], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return session + [line for line in run.stdout.splitlines() if "::" in line]


def test_every_rule_matches_a_collected_test_and_gives_a_reason(request):
    files = sorted({pattern.split("::", 1)[0] for pattern, _ in SLOW_TESTS})
    assert not [f for f in files if not (ROOT / f).is_file()], "a rule names no file"
    node_ids = collected_node_ids(request.config, files)
    # The collection did run and reached the rules' files (else this could not fail).
    assert {node_id.split("::", 1)[0] for node_id in node_ids} >= set(files)
    unmatched = [pattern for pattern, _ in SLOW_TESTS
                 if not any(matches(pattern, node_id) for node_id in node_ids)]
    assert not unmatched, "rules that match no collected test (renamed or moved?)"
    assert all(reason.strip() for _, reason in SLOW_TESTS)


def test_a_rule_for_a_renamed_test_matches_nothing():
    node_id = "tests/backends/test_jax.py::test_jit_matches_eager[evd]"
    assert matches("tests/backends/test_jax.py::test_jit_matches_eager[evd]", node_id)
    assert matches("tests/backends/test_jax.py::test_jit_matches_eager[*", node_id)
    assert not matches("tests/backends/test_jax.py::test_jit_equals_eager[evd]", node_id)
    assert not matches("tests/test_jax.py::test_jit_matches_eager[evd]", node_id)
