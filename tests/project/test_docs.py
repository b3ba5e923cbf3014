"""The docs: they build without warnings, their examples run, their data is current."""

from __future__ import annotations

import doctest
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hang_guard import HANG_GUARD_S

DOCS = Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS))
make_plots = pytest.importorskip("make_plots")
registry_tables = pytest.importorskip("registry_tables")

needs_sphinx = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("sphinx", "numpydoc", "matplotlib")),
    reason="the docs need sphinx, numpydoc and matplotlib")


@needs_sphinx
def test_docs_build_without_warnings(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("index", "getting_started", "methods", "scaling", "support", "api",
                 "optimizer", "distributed", "benchmarks", "command_line", "architecture"):
        assert (tmp_path / "html" / f"{page}.html").exists(), page
    index = (tmp_path / "html" / "index.html").read_text(encoding="utf-8")
    assert "getting_started.html" in index and "api.html" in index
    api = (tmp_path / "html" / "api.html").read_text(encoding="utf-8")
    for name in ("inv_root_info", "InvRootResult", "power_iteration", "spectral_bounds"):
        assert f'id="matroot.{name}"' in api, name
    assert (tmp_path / "html" / "_images" / "scaling_iterations.png").exists()
    for name in ("Shampoo", "ShampooConfig", "init", "update"):
        assert f'id="matroot.optim.{name}"' in api, name
    from matroot.solvers import SOLVERS

    methods = (tmp_path / "html" / "methods.html").read_text(encoding="utf-8")
    for method in SOLVERS:
        assert f">{method}<" in methods, method
    for page in (tmp_path / "html").glob("*.html"):
        # Offline: no script or stylesheet from the network (MathJax's CDN included).
        text = page.read_text(encoding="utf-8")
        assert not re.search(r'<(script|link)[^>]+(src|href)="(https?:)?//', text), page.name


def _cli_verbs(parser=None):
    """Every verb of a command line (matroot's by default), as 'demo', 'plan', ..."""
    import argparse

    from matroot.cli import build_parser

    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield f"{prefix}{name}"
                    yield from walk(sub, f"{prefix}{name} ")

    return list(walk(parser or build_parser(), ""))


def test_docs_name_every_public_name_method_and_verb():
    import matroot
    import matroot.optim
    from matroot.solvers import SOLVERS

    api = (DOCS / "api.rst").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\.\. auto(?:function|class|exception):: (\w+)$", api,
                                re.MULTILINE))
    public = set(matroot.__all__) | set(matroot.optim.__all__)
    assert not public - documented, f"not in docs/api.rst: {sorted(public - documented)}"
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    for method in SOLVERS:  # docs/methods.rst renders its table from the registry
        assert f"`{method}`" in readme, f"{method} missing from the README's methods table"
    command_line = (DOCS / "command_line.rst").read_text(encoding="utf-8")
    verbs = _cli_verbs()
    assert {"demo", "info", "plan"} <= set(verbs)
    for verb in verbs:
        assert f"matroot {verb}" in command_line, f"'matroot {verb}' not in command_line.rst"
    # The benchmarks (not installed; ``python -m bench`` from a checkout): each verb and
    # script in docs/benchmarks.rst's list.
    from bench.__main__ import build_parser as bench_parser

    benchmarks = (DOCS / "benchmarks.rst").read_text(encoding="utf-8")
    bench_verbs = _cli_verbs(bench_parser())
    assert {"solvers", "optim", "polar", "launches", "muon_char"} <= set(bench_verbs)
    for verb in bench_verbs:
        assert f"python -m bench {verb}" in benchmarks, f"{verb} not in benchmarks.rst"


def test_getting_started_examples_run():
    pytest.importorskip("torch")
    result = doctest.testfile(str(DOCS / "getting_started.rst"), module_relative=False,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 10
    assert result.failed == 0


def test_launches_examples_run():
    """docs/launches.rst: the device verdict reads nothing on the host, the host one once."""
    pytest.importorskip("torch")
    result = doctest.testfile(str(DOCS / "launches.rst"), module_relative=False,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 8
    assert result.failed == 0


def test_readme_jax_example_asks_float32_for_roots_it_can_certify():
    """The README's JAX line roots the NumPy example's factors in float32 (JAX's default,
    x64 off) under jax.jit, where inv_root cannot warn. With eps=1e-6 their κ was about
    6e8, past float32's table (κ ≤ 1e6): every root came back converged=False, silently."""
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    numpy_block = next(b for b in blocks if "NumPy: 8 rank-64" in b)
    jax_line = next(line for b in blocks for line in b.splitlines() if "jax.jit(" in line)
    shape = tuple(int(d) for d in re.search(r"standard_normal\(\(([\d, ]+)\)\)",
                                            numpy_block).group(1).split(","))
    eps = float(re.search(r"eps=([0-9.e-]+)", jax_line).group(1))
    g = np.random.default_rng(0).standard_normal(shape)
    lam = np.linalg.eigvalsh(g @ g.transpose(0, 2, 1))
    kappa = (lam[:, -1] + eps) / (np.maximum(lam[:, 0], 0.0) + eps)
    assert kappa.max() <= 1e6, kappa.max()


def test_jax_examples_run_and_converge():
    """docs/jax.rst's examples, as a new user runs them: a fresh process (x64 off, no
    compiled functions from other tests), under the suite's hang guard (issue 26)."""
    for module in ("jax", "optax", "torch"):
        pytest.importorskip(module)
    script = ("import doctest, sys\n"
              "r = doctest.testfile(sys.argv[1], module_relative=False,\n"
              "                     optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)\n"
              "print(r.attempted, r.failed)\n")
    # Without the suite's XLA flags and thread limits, as a user runs them.
    suite_only = ("XLA_FLAGS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                  "MATROOT_TEST_THREADS", "JAX_COMPILATION_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if k not in suite_only}
    run = subprocess.run([sys.executable, "-c", script, str(DOCS / "jax.rst")],
                         capture_output=True, text=True, timeout=HANG_GUARD_S, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    attempted, failed = map(int, run.stdout.split()[-2:])
    assert failed == 0, run.stdout[-3000:]
    assert attempted >= 20


#: info's probe statuses, mapped to what the support page claims.
_PAGE_STATUS = {"yes": {"yes", "emulated"}, "not converged": {"yes", "emulated"},
                "inaccurate": {"yes", "emulated"}, "no effect": {"ignored"},
                "unsupported": {"no"}}


def test_support_page_matches_what_info_finds():
    from matroot.cli.info import collect

    rows = registry_tables.support_rows()
    column = {("numpy", "cpu"): "numpy", ("torch", "cpu"): "torch (CPU)",
              ("array_api_strict", "cpu"): "array_api_strict", ("cupy", "cuda:0"): "cupy",
              ("torch", "cuda:0"): "torch (CUDA)", ("jax", "cpu"): "jax (CPU)"}
    claims = {(r["method"], r["precision"], col): r[col] for r in rows for col in column.values()}
    probed = [s for s in collect()["support"] if (s["backend"], s["device"]) in column]
    assert probed, "no backend to compare with"
    for entry in probed:
        col = column[(entry["backend"], entry["device"])]
        key = (entry["method"], entry["precision"], col)
        assert key in claims, f"the support table has no row for {key[:2]}"
        claim = claims[key]
        assert claim in _PAGE_STATUS[entry["status"]], (entry, claim)


def test_methods_table_rendering():
    data = {"records": [
        {"kappa": 100.0, "method": "newton_db", "precision": "float32", "variant": "default",
         "rel_err_max": 2e-6, "iterations": [17, 16], "matmuls": [51, 48],
         "converged": [True, True]},
        {"kappa": 1e4, "method": "newton_db", "precision": "float32", "variant": "default",
         "rel_err_max": float("nan"), "iterations": [60, 60], "matmuls": [180, 180],
         "converged": [False, True]},
    ]}
    table = make_plots.methods_table_rst(data)
    assert "κ = 1e2" in table and "κ = 1e4" in table
    assert "2e-06, 17 it, 51 mm" in table
    assert "diverged, 60 it, 180 mm, 1/2 conv." in table


def _load(name):
    return json.loads((DOCS / "data" / f"{name}.json").read_text())


def test_scaling_data_is_current():
    """Re-measure one κ of docs/data/scaling.json; a mismatch means the solvers
    changed: run ``python docs/make_plots.py measure``."""
    import matroot

    data = _load("scaling")
    kappa = 100.0
    factors = make_plots.gram_factors()
    for record in (r for r in data["records"] if r["kappa"] == kappa):
        res = matroot.inv_root_info(factors, make_plots.P, method=record["method"],
                                    eps=make_plots.ridge_for(kappa),
                                    scaling=record["scaling"],
                                    tol=make_plots.SCALING_TOL, max_iter=200)
        assert np.asarray(res.iterations).tolist() == record["iterations"], record
    assert {(r["method"], r["scaling"]) for r in data["records"]} == {
        (m, s) for m in ("newton_db", "coupled_newton") for s in ("power", "frobenius")}


def test_methods_data_is_current():
    """Re-measure the float32 rows at κ = 1e2 of docs/data/methods.json."""
    torch = pytest.importorskip("torch")
    import matroot

    data = _load("methods")
    kappa = 100.0
    eps = make_plots.ridge_for(kappa)
    factors = make_plots.gram_factors(seed=1).astype(np.float32)
    exact = make_plots.oracle(factors.astype(np.float64), eps, make_plots.P)
    rows = [r for r in data["records"] if r["kappa"] == kappa
            and r["precision"] == "float32" and r["variant"] == "default"]
    assert {r["method"] for r in rows} == set(matroot.solvers.SOLVERS)
    for record in rows:
        res = matroot.inv_root_info(torch.from_numpy(factors), make_plots.P,
                                    method=record["method"], eps=eps)
        assert res.iterations.tolist() == record["iterations"], record["method"]
        worst = float(np.max(make_plots.relative_errors(res.root, exact)))
        assert worst == pytest.approx(record["rel_err_max"], rel=0.5), record["method"]
