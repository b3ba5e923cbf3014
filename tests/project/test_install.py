"""What a fresh install promises: a licence, metadata, clear errors without optional extras."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
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
