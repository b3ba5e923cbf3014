"""Smoke tests of the overhead and DASH experiments, scripts in the repository's bench/
(tiny sizes; ratios are not asserted)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _script(name: str):
    """The experiment script ``bench/<name>.py``, imported as a module."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


overheads = _script("overheads")
dash_reference = _script("dash_reference")


@pytest.mark.parametrize("name", ["overheads", "dash_reference"])
def test_scripts_run_from_any_folder_and_write_beside_themselves(name, tmp_path):
    """``python -m bench NAME`` with the checkout on the path, from another folder."""
    run = subprocess.run([sys.executable, "-m", "bench", name, "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=HANG_GUARD_S,
                         env={**os.environ, "PYTHONPATH": str(BENCH.parent)})
    assert run.returncode == 0, run.stderr
    assert f"python -m bench {name}" in run.stdout
    assert _script(name).RESULTS == BENCH / "results"


def test_floor_and_evd_rows(tmp_path):
    floor = overheads.matmul_floor_rows((32,), (1e2,), (2,), batch=2, repeats=1,
                                        budget_s=0.1)
    assert {r["method"] for r in floor} == {"newton_db", "coupled_newton", "minimax"}
    assert all(r["matmuls"] > 0 and r["time_over_floor"] > 0 for r in floor)
    # The counted product-equivalents add the check's to the solver's matmuls.
    assert all(r["counted"] > r["matmuls"] and r["time_over_counted"] > 0 for r in floor)
    evd = overheads.evd_rows([(8, 4)], repeats=1, budget_s=0.1)
    assert [(r["backend"], r["spectrum"]) for r in evd] == [
        ("torch", "wishart"), ("torch", "kappa1e4"), ("numpy", "wishart"), ("numpy", "kappa1e4")]
    text = overheads._markdown({"floor": floor, "evd": evd})
    assert text.count("\n|") == 4 + len(floor) + len(evd)


def test_dash_comparison_is_skipped_without_the_wheel(monkeypatch, capsys):
    if importlib.util.find_spec("ista_daslab_optimizers") is not None:
        pytest.skip("the DASH wheel is installed here")
    assert dash_reference.compare((1e2,), (2,), (5e-3,), n=8, batch=1) == []
    assert "skipped" in capsys.readouterr().out


def test_dash_comparison_rows_and_summary():
    """With the wheel: every (κ, p, goal) has a DASH row (stock or fp32 scale) and
    matroot's configurations asked for rtol=goal; the summary names the fastest."""
    if importlib.util.find_spec("ista_daslab_optimizers") is None:
        pytest.skip("the DASH wheel is not installed (pip install ista-daslab-optimizers)")
    rows = dash_reference.compare((1e2,), (2,), (5e-3,), n=16, batch=2, repeats=1,
                                  budget_s=0.1)
    labels = [r["contender"] for r in rows]
    assert any(label.startswith("DASH") for label in labels)
    assert any("rtol=0.005" in label for label in labels)
    assert "matroot's fastest" in dash_reference._markdown(rows, "smoke")


def test_overheads_profile_runs_its_phases():
    """The phase profile wraps names that exist in matroot.roots.stack_solve (it broke
    silently once when they moved) and reports both λmax bounds."""
    profile = _script("overheads_profile")
    report = profile.main(["--batch", "2", "--n", "32", "--methods", "minimax", "--p", "2",
                           "--repeats", "1", "--threads", "1", "--passes"])
    assert {row["bound"] for row in report["runs"]} == {"cholesky", "randomized"}
    for row in report["runs"]:
        assert row["ms"]["lanczos"] > 0 and row["ms"]["root check"] > 0
        assert row["ratio"] > 0
    # The Cholesky-bound call's n×n products are timed where they run: at least
    # the check's three (p = 2) besides the solver's.
    timed = next(row for row in report["runs"] if row["bound"] == "cholesky")
    assert len(timed["products_ms"]) > 3 and timed["product_slowdown"]["median"] > 0
    # Counted, not timed: the profiler sees the same products the wrapper timed.
    assert timed["passes"]["products"] == len(timed["products_ms"])
    assert timed["passes"]["fresh passes"] > 0
