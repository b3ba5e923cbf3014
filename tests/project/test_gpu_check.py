"""bench/gpu_check.sh on a CPU: its dry run, its bookkeeping when steps fail or time runs out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.sh"
STEPS = ["environment", "info", "tests", "demo", "bench-solvers", "bench-optim"]

pytestmark = [
    pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                       reason="needs bash and coreutils timeout"),
    pytest.mark.skipif(os.environ.get("MATROOT_GPU_CHECK_RUNNING") == "1",
                       reason="running inside gpu_check.sh itself"),
]


#: The dry run's step caps and budget are sized for an idle machine; a test on a busy
#: 2-core machine must not fail on them, so it lifts them (the budget test below
#: checks the bookkeeping of a spent budget on its own).
UNHURRIED = {"GPU_CHECK_CAP_SCALE": "50", "GPU_CHECK_BUDGET_S": "36000"}


def run_script(*args, **env):
    full_env = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=full_env, timeout=HANG_GUARD_S)


def test_dry_run_records_every_step(tmp_path):
    # The benchmarks' own CPU sizes belong to their tests; here --help checks that
    # the script reaches them through `python -m bench`. info's probe of every backend is
    # test_docs's, the demo's test_cli's: here NumPy shows the steps run.
    proc = run_script("--dry-run", str(tmp_path), GPU_CHECK_SOLVERS_ARGS="--help",
                      GPU_CHECK_OPTIM_ARGS="--help", GPU_CHECK_INFO_ARGS="--backend numpy",
                      GPU_CHECK_DEMO_ARGS="--backend numpy", **UNHURRIED)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dry_run"] is True
    steps = {s["step"]: s for s in summary["steps"]}
    assert [s["step"] for s in summary["steps"]] == STEPS
    for name in STEPS:
        assert steps[name]["status"] == "ok", (tmp_path / f"{name}.log").read_text()
    for name in ("bench-solvers", "bench-optim"):  # the checkout's `python -m bench`
        assert "usage: python -m bench" in (tmp_path / f"{name}.log").read_text()
    assert proc.returncode == (0 if summary["passed"] else 1)
    assert "tests collected" in (tmp_path / "tests.log").read_text()
    demo = json.loads((tmp_path / "demo.json").read_text())
    assert demo["problem"]["n"] == 24
    assert (tmp_path / "demo.png").stat().st_size > 0
    info = json.loads((tmp_path / "info.json").read_text())
    assert info["backends"][0]["name"] == "numpy"


def test_spent_budget_skips_steps_but_writes_the_summary(tmp_path):
    proc = run_script("--dry-run", str(tmp_path), GPU_CHECK_BUDGET_S="1")
    assert proc.returncode == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == STEPS
    assert {s["status"] for s in summary["steps"]} == {"skipped"}
    assert summary["passed"] is False


def test_without_a_gpu_it_says_so(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi is present")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    proc = run_script(str(tmp_path))
    assert proc.returncode == 2
    assert "no NVIDIA GPU visible" in proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"][0]["step"] == "gpu" and not summary["passed"]


def test_usage_errors():
    proc = run_script()
    assert proc.returncode == 2 and "give an output folder" in proc.stderr
    proc = run_script("--fast", "x")
    assert proc.returncode == 2 and "unknown option --fast" in proc.stderr
