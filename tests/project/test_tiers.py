"""The slow and extended tables of tests/tiers.py: their rules match what they say, every
rule matches a test that pytest collects (so a renamed or moved test cannot silently
move tier), and CI runs the extended tier after the README's test command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S
from tiers import (EXTENDED_COMMAND, EXTENDED_TESTS, SLOW_TESTS, extended_reason, matches,
                   runs_extended, slow_reason)

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
         "-m", "extended or not extended", *rest],     # every tier's tests
        cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return session + [line for line in run.stdout.splitlines() if "::" in line]


@pytest.mark.parametrize("table", [SLOW_TESTS, EXTENDED_TESTS], ids=["slow", "extended"])
def test_every_rule_matches_a_collected_test_and_gives_a_reason(request, table):
    files = sorted({pattern.split("::", 1)[0] for pattern, _ in table})
    assert not [f for f in files if not (ROOT / f).is_file()], "a rule names no file"
    node_ids = collected_node_ids(request.config, files)
    # The collection did run and reached the rules' files (else this could not fail).
    assert {node_id.split("::", 1)[0] for node_id in node_ids} >= set(files)
    unmatched = [pattern for pattern, _ in table
                 if not any(matches(pattern, node_id) for node_id in node_ids)]
    assert not unmatched, "rules that match no collected test (renamed or moved?)"
    assert all(reason.strip() for _, reason in table)


def test_an_extended_test_is_slow_and_runs_only_when_named():
    extended = ("tests/backends/test_jax_user_loop.py::"
                "test_the_user_loop_finishes_for_every_root_method[1]")
    default = extended.replace("[1]", "[0]")
    assert extended_reason(extended) and slow_reason(extended, set())
    assert extended_reason(default) is None
    assert runs_extended("extended") and runs_extended("slow or (extended)")
    assert runs_extended("not extended")          # names it: -m itself then decides
    assert not runs_extended("") and not runs_extended("not slow")
    assert not runs_extended("not extendedish")


def test_ci_runs_the_readme_command_then_the_extended_tier():
    """CI runs every test: the README's command verbatim (read from its markers),
    then the extended tier's command in the environment that command made."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci and 'bash -euo pipefail -c "$cmd"' in ci
    readme_run = ci.index('bash -euo pipefail -c "$cmd"')
    extended = ci.index(EXTENDED_COMMAND.replace("python ", ".venv/bin/python ", 1))
    assert extended > readme_run
    readme = (ROOT / "README.md").read_text()
    assert EXTENDED_COMMAND in readme and "python -m pytest -n 2\n" in readme


def test_a_rule_for_a_renamed_test_matches_nothing():
    node_id = "tests/backends/test_jax.py::test_jit_matches_eager[evd]"
    assert matches("tests/backends/test_jax.py::test_jit_matches_eager[evd]", node_id)
    assert matches("tests/backends/test_jax.py::test_jit_matches_eager[*", node_id)
    assert not matches("tests/backends/test_jax.py::test_jit_equals_eager[evd]", node_id)
    assert not matches("tests/test_jax.py::test_jit_matches_eager[evd]", node_id)
