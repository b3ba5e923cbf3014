"""The command line: the demo on a tiny problem, info, the dispatcher and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hang_guard import HANG_GUARD_S

from matroot.cli import main
from matroot.solvers import SOLVERS
from matroot.testing.backends import (
    UnavailableError,
    discover,
    normalize_backend,
    select_targets,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
AVAILABLE = {info.name: info for info in discover() if info.available}


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("matroot")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


def test_demo_quick_table_json_and_plot(tmp_path, capsys):
    plot, report_path = tmp_path / "demo.png", tmp_path / "demo.json"
    code, out, err = run_cli(capsys, "demo", "--quick", "--backend", "numpy,torch",
                             "--out", str(plot), "--json", str(report_path))
    assert code == 0, err
    report = json.loads(report_path.read_text())
    expected = ["eigh (baseline)", *SOLVERS]
    for backend in ("numpy", "torch"):
        rows = [r for r in report["rows"] if r["backend"] == backend]
        assert [r["method"] for r in rows] == expected
        for row in rows:
            assert row["time_s"] > 0
            assert 0 < row["rel_err_median"] <= row["rel_err_max"]
        by_method = {r["method"]: r for r in rows}
        # float32 eigh-based roots of kappa <= 1e5 factors are accurate to ~1e-4.
        assert by_method["eigh (baseline)"]["rel_err_max"] < 1e-3
        assert by_method["evd"]["rel_err_max"] < 1e-3
        assert by_method["evd"]["converged"] == by_method["evd"]["total"] == 4
        for method in SOLVERS:
            assert by_method[method]["speedup_vs_eigh"] == pytest.approx(
                by_method["eigh (baseline)"]["time_s"] / by_method[method]["time_s"])
    assert report["problem"]["batch"] == 4 and report["problem"]["n"] == 24
    for method in SOLVERS:
        assert method in out
    assert "fastest with worst error" in out
    assert plot.read_bytes()[:8] == PNG_MAGIC


def test_demo_float64_agrees_with_the_oracle(tmp_path, capsys):
    report_path = tmp_path / "demo.json"
    code, _, err = run_cli(capsys, "--quick", "--dtype", "float64", "--backend", "numpy",
                           "--method", "evd", "--no-plot", "--json", str(report_path))
    assert code == 0, err
    rows = json.loads(report_path.read_text())["rows"]
    assert [r["method"] for r in rows] == ["eigh (baseline)", "evd"]
    assert all(r["rel_err_max"] < 1e-9 for r in rows)


def test_demo_runs_the_methods_that_take_p(tmp_path, capsys):
    """Without --method, the demo runs every method that takes --p (a method named
    with --method that does not is refused before any work, as a usage error)."""
    report_path = tmp_path / "demo.json"
    code, out, _ = run_cli(capsys, "--quick", "--p", "3", "--backend", "numpy",
                           "--no-plot", "--json", str(report_path))
    assert code == 0
    rows = {r["method"]: r for r in json.loads(report_path.read_text())["rows"]}
    assert "newton_db" not in rows and "minimax" not in rows
    assert rows["coupled_newton"]["converged"] == 4
    assert "skipped" not in out


def test_info_lists_backends_and_probes_support(capsys):
    code, out, _ = run_cli(capsys, "info", "--json", "--backend", "numpy")
    assert code == 0
    data = json.loads(out)
    names = [b["name"] for b in data["backends"]]
    assert names == ["numpy", "torch", "array_api_strict", "jax", "cupy"]
    numpy_info = data["backends"][0]
    assert numpy_info["version"] == np.__version__ and numpy_info["devices"] == ["cpu"]
    cells = {(s["method"], s["precision"]): s for s in data["support"]}
    assert {s["backend"] for s in data["support"]} == {"numpy"}
    assert len(cells) == len(SOLVERS) * len(data["precisions"])
    for method in SOLVERS:
        assert cells[(method, "float64")]["status"] == "yes"
        assert cells[(method, "float32")]["status"] == "yes"
        assert cells[(method, "bfloat16 matmuls")]["status"] == "unsupported"
    assert cells[("evd", "float16 matmuls")]["status"] == "no effect"
    assert data["p_support"]["evd"] == [0.5, 1, 2, 3, 4, 8]
    assert 3 not in data["p_support"]["newton_db"]


def test_info_text_names_every_backend(capsys):
    code, out, _ = run_cli(capsys, "info", "--backend", "numpy")
    assert code == 0
    for name in ("numpy", "torch", "array_api_strict", "jax", "cupy"):
        assert name in out
    assert "root orders p each method accepts" in out


def test_info_on_a_machine_without_accelerators_imports_neither_torch_nor_jax():
    """``matroot info`` as a user runs it (a fresh process, no flags) answers fast on a
    CPU machine because it does not import torch or JAX just to find no GPU; the
    versions it prints are the installed ones all the same."""
    from matroot.testing.backends import accelerator_possible
    if accelerator_possible():
        pytest.skip("this machine may have an accelerator: info imports torch and JAX")
    code = ("import json, sys; from matroot.cli import main; main(['info', '--json']); "
            "print(json.dumps(sorted(m for m in ('torch', 'jax') if m in sys.modules)))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=HANG_GUARD_S, check=True)
    *report, imported = run.stdout.strip().splitlines()
    assert json.loads(imported) == []
    versions = {b["name"]: b["version"] for b in json.loads("\n".join(report))["backends"]}
    for name in ("torch", "jax"):
        if name in AVAILABLE:
            assert versions[name] == AVAILABLE[name].version


@pytest.mark.parametrize("argv, fragments", [
    (["--backend", "tensorflow"], ["unknown backend 'tensorflow'", "numpy"]),
    (["info", "--backend", "mxnet"], ["unknown backend 'mxnet'"]),
    (["--method", "magic"], ["unknown method 'magic'", "evd"]),
    (["demo", "--p", "3", "--method", "newton_db"],
     ["--method newton_db does not take --p 3", "coupled_newton"]),
    (["--batch", "0", "--no-plot"], ["--batch must be a positive integer"]),
    (["--eps", "0"], ["--eps must be a finite number > 0"]),
    (["--backend", "numpy", "--device", "cuda"],
     ["device 'cuda:0' is not available for numpy"]),
    (["--out", "/nonexistent/dir/x.png"], ["the folder /nonexistent/dir does not exist"]),
    (["--json", "/nonexistent/dir/x.json", "--no-plot"], ["--json", "does not exist"]),
    (["--threads", "-1"], ["--threads must be >= 0"]),
    (["--size", "abc"], ["invalid int value: 'abc'"]),
    (["plan", "--block-size", "0"], ["matroot plan: error", "block_size"]),
    (["plan", "--shapes", "12xq"], ["matroot plan: error"]),
])
def test_friendly_errors(capsys, argv, fragments):
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, *fragments)


@pytest.mark.skipif("cupy" in AVAILABLE, reason="cupy is installed here")
def test_missing_backend_is_one_line(capsys):
    code, _, err = run_cli(capsys, "--backend", "cupy")
    assert_one_line_error(code, err, "backend 'cupy' is not available", "pip install")


@pytest.mark.skipif(any(len(i.devices) > 1 or i.name == "cupy" for i in AVAILABLE.values()),
                    reason="a GPU is available here")
def test_missing_device_is_one_line(capsys):
    code, _, err = run_cli(capsys, "--device", "cuda:0")
    assert_one_line_error(code, err, "device 'cuda:0' is not available",
                          "no installed backend has it")
    code, _, err = run_cli(capsys, "info", "--device", "cuda")
    assert_one_line_error(code, err, "device 'cuda' is not available")


def test_select_targets():
    assert normalize_backend("array-api-strict") == "array_api_strict"
    cpu = select_targets(None, "cpu")
    assert {t.backend for t in cpu} == set(AVAILABLE)
    assert all(t.device == "cpu" for t in cpu)
    assert [t.backend for t in select_targets(["numpy", "numpy"], None)] == ["numpy"]
    with pytest.raises(UnavailableError, match="unknown backend"):
        select_targets(["nope"], None)


@pytest.mark.parametrize("target", select_targets(None, None), ids=lambda t: t.label)
def test_targets_round_trip_arrays(target):
    from matroot import _xp

    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = target.asarray(host)
    target.synchronize()
    assert _xp.backend_name(_xp.array_namespace(x)) == target.backend
    np.testing.assert_array_equal(_xp.to_numpy(x), host)


@pytest.mark.parametrize("argv", [[], ["demo"], ["info"], ["plan"]])
def test_every_verb_has_help(argv, capsys):
    code, out, _ = run_cli(capsys, *argv, "--help")
    assert code == 0
    assert out.startswith("usage: matroot " + " ".join(argv))


@pytest.mark.parametrize("argv", [["bench"], ["bench", "solvers", "--quick"]])
def test_bench_says_where_the_benchmarks_went(argv, capsys):
    """The benchmarks are not installed (``python -m bench`` from a checkout runs them):
    ``matroot bench`` of earlier versions says so in one line, not "invalid choice"."""
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, "not installed", "python -m bench --help")


def test_bad_input_is_refused_before_any_work(monkeypatch, capsys):
    import matroot.cli.demo_run

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the input was checked")

    monkeypatch.setattr(matroot.cli.demo_run, "run_demo", no_work)
    for argv in (["demo", "--out", "/nonexistent/dir/x.png"],
                 ["demo", "--repeats", "0", "--no-plot"]):
        code, _, err = run_cli(capsys, *argv)
        assert_one_line_error(code, err)


def test_missing_matplotlib_is_one_line_before_work(monkeypatch, capsys):
    import matroot.cli.common as common

    real = common.importlib.util.find_spec
    monkeypatch.setattr(common.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    code, _, err = run_cli(capsys, "--quick", "--backend", "numpy")
    assert_one_line_error(code, err, "needs matplotlib", "matroot[bench]")


def test_plan_runs(capsys):
    code, out, _ = run_cli(capsys, "plan", "--shapes", "256x128,64", "--block-size", "64",
                           "--world-size", "2", "--json")
    assert code == 0
    assert json.loads(out)["worlds"][0]["world_size"] == 2


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "matroot", "--backend", "no-such"],
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("matroot demo: error: unknown backend 'no-such'; choose "
                                   "from numpy, torch, array_api_strict, jax, cupy")
    version = subprocess.run([sys.executable, "-m", "matroot", "--version"],
                             capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert version.returncode == 0 and version.stdout.startswith("matroot ")


def test_info_save_writes_the_json(tmp_path, capsys):
    path = tmp_path / "info.json"
    code, out, _ = run_cli(capsys, "info", "--backend", "numpy", "--save", str(path))
    assert code == 0 and "backends:" in out
    saved = json.loads(path.read_text())
    assert {s["backend"] for s in saved["support"]} == {"numpy"}


def test_demo_reports_a_crashing_solver_and_goes_on(monkeypatch, tmp_path, capsys):
    import matroot

    real = matroot.inv_root_info

    def flaky(a, p, *, method, **kwargs):
        if method == "coupled_newton":
            raise IndexError("index out of range\nsecond line")
        return real(a, p, method=method, **kwargs)

    monkeypatch.setattr(matroot, "inv_root_info", flaky)
    report_path = tmp_path / "demo.json"
    code, out, _ = run_cli(capsys, "--quick", "--backend", "numpy", "--no-plot",
                           "--json", str(report_path))
    assert code == 0
    rows = {r["method"]: r for r in json.loads(report_path.read_text())["rows"]}
    assert rows["coupled_newton"]["note"] == "failed with IndexError: index out of range"
    assert rows["coupled_newton"]["time_s"] is None
    assert rows["chebyshev"]["converged"] is not None
    assert "failed with IndexError: index out of range" in out


def test_demo_and_info_report_their_thread_policy(tmp_path, capsys):
    report_path = tmp_path / "demo.json"
    code, out, err = run_cli(capsys, "--quick", "--backend", "numpy", "--method", "evd",
                             "--no-plot", "--json", str(report_path))
    assert code == 0, err
    assert "threads: 1 thread per library" in out
    report = json.loads(report_path.read_text())
    assert report["threads"]["threads"] == 1
    assert all(count == 1 for count in report["threads"]["pools"].values())
    # Progress: one line per contender (stderr is not a terminal here).
    assert "[2/2]" in err and "numpy: evd" in err
    code, out, _ = run_cli(capsys, "info", "--backend", "numpy", "--json", "--threads", "2")
    assert code == 0 and json.loads(out)["threads"]["policy"] == "2 threads per library"
    from threadpoolctl import threadpool_info

    # The policy holds for the verb only: the calling process gets its pools back.
    assert {pool["num_threads"] for pool in threadpool_info()} == {1}


def test_info_probes_numpy_and_accelerators_by_default(capsys):
    """``matroot info`` without options answers in seconds: NumPy and the devices that
    are not a CPU; the other CPU backends (JAX compiles each probe) wait for --all."""
    code, out, _ = run_cli(capsys, "info", "--json")
    assert code == 0
    probed = {(s["backend"], s["device"]) for s in json.loads(out)["support"]}
    assert ("numpy", "cpu") in probed
    assert all(backend == "numpy" or device != "cpu" for backend, device in probed)
    code, out, _ = run_cli(capsys, "info")
    assert code == 0 and "--all" in out


# Odd but plausible arguments a user passed, each a test that failed before its fix.

def one_line_error(capsys, *argv) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv, fragment", [
    (["demo", "--p", "inf", "--no-plot"], "--p must be a finite number > 0"),  # was exit 0
    (["demo", "--eps", "inf", "--no-plot"], "--eps must be a finite number > 0"),
])
def test_infinite_options_are_refused_before_any_work(capsys, argv, fragment):
    assert fragment in one_line_error(capsys, *argv)


@pytest.mark.parametrize("text", ["", ",", " , "])
def test_plan_refuses_empty_shapes(text):
    from matroot.optim.distributed.cluster_sizing import parse_shapes

    with pytest.raises(ValueError, match="--shapes is empty"):
        parse_shapes(text)
