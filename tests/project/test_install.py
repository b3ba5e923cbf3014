"""What a fresh install promises: a licence, metadata, clear errors without optional extras,
and a wheel of the library and its command alone (the benchmarks stay in the checkout)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hang_guard import HANG_GUARD_S

import matroot

ROOT = Path(__file__).resolve().parents[2]


def test_license_file_matches_the_metadata():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "BSD-3-Clause"
    assert "BSD 3-Clause License" in (ROOT / "LICENSE").read_text()
    assert any(c.startswith("Programming Language :: Python :: 3")
               for c in project["classifiers"])


def test_shampoo_without_torch_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    from matroot.optim import Shampoo\n"
            "except ImportError as err:\n    print(err)\n"
            "from matroot.optim import init  # the functional core needs no torch\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    assert 'pip install "matroot[torch]"' in proc.stdout


def test_result_repr_is_one_short_line():
    a = np.random.default_rng(0).standard_normal((6, 64, 64))
    result = matroot.inv_root_info(a @ np.swapaxes(a, -1, -2), 2, eps=1e-3,
                                   method="newton_db")
    text = repr(result)
    assert "\n" not in text and len(text) < 160
    assert "float64[6, 64, 64]" in text and "converged 6/6" in text
    assert "newton_db" in text


def test_the_wheel_ships_the_library_and_its_command_only(tmp_path):
    """The benchmarks (bench/) stay in the checkout; the wheel holds matroot, whose
    command-line part (the installed lines that are not the library) stays small."""
    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "results")
    for folder in ("matroot", "bench"):
        shutil.copytree(ROOT / folder, source / folder, ignore=skip)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", ".", "-w", str(tmp_path / "dist")],
                          cwd=source, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("matroot-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        tools = [n for n in names if n.startswith("matroot/cli/") or n == "matroot/__main__.py"]
        tool_lines = sum(archive.read(n).decode().count("\n") for n in tools)
    assert {n.split("/")[0] for n in names} == {"matroot", wheel.name.split("-py3")[0]
                                                + ".dist-info"}
    assert not [n for n in names if n.startswith("matroot/bench")]
    assert "matroot/cli/demo_run.py" in names and "matroot/py.typed" in names
    assert 0 < tool_lines <= 1500, f"{tool_lines} installed lines of command line"
