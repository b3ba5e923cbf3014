"""``python -m bench``, the benchmarks' entry point from a checkout: its verbs' one-line
errors before any work, their help, and the experiment scripts it dispatches to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from bench.__main__ import SCRIPTS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_a_scratch_folder(tmp_path, monkeypatch):
    """Some refusals come after ``--out`` (default ./matroot-bench) is created: not here."""
    monkeypatch.chdir(tmp_path)


def one_line_error(capsys, *argv) -> str:
    """Run ``python -m bench ARGV`` in-process; its one-line error (exit code 2)."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("python -m bench"), err
    return lines[0]


@pytest.mark.parametrize("argv, fragments", [
    (["optim", "--method", "bogus"], ["unknown method 'bogus'", "auto, evd"]),
    (["optim", "--block-size", "0"], ["--block-size must be a positive integer"]),
    (["optim", "--steps", "-1"], ["--steps must be a positive integer, got -1"]),
    (["optim", "--warmup", "-1"], ["--warmup must be >= 0"]),
    (["optim", "--backend", "jaxx"], ["unknown backend 'jaxx'"]),
    (["optim", "--out", "/nonexistent/dir/o.json"], ["does not exist"]),
    (["solvers", "--methods", "bogus"], ["unknown method 'bogus'", "eigh_loop"]),
    (["solvers", "--sizes", "0"], ["--sizes must be a positive integer"]),
    (["solvers", "--backends", "tensorflow"], ["unknown backend 'tensorflow'"]),
    (["solvers", "--kappa", "0.5"], ["--kappa must be a finite number >= 1"]),
    (["solvers", "--out", "/proc/matroot"], ["is not a writable folder"]),
    (["plots", "/nonexistent.json"], ["no such results file"]),
    (["nope"], ["invalid choice: 'nope'"]),
])
def test_friendly_errors(capsys, argv, fragments):
    line = one_line_error(capsys, *argv)
    for fragment in fragments:
        assert fragment in line


@pytest.mark.parametrize("argv", [[], ["solvers"], ["optim"], ["polar"], ["launches"],
                                  ["plots"], ["report"]])
def test_every_verb_has_help(argv, capsys):
    assert main([*argv, "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m bench " + " ".join(argv))


def test_help_lists_every_benchmark_and_script(capsys):
    """One entry point reaches everything in bench/: each verb and each script."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("solvers", "optim", "polar", "launches", "plots", "report", *SCRIPTS):
        assert f"    {name}" in out, name
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")} - {
        "__init__", "__main__", "cli", *build_parser()._subparsers._group_actions[0].choices}
    modules = {"certification", "config", "dash", "machine", "optim_compile",
               "optim_launches", "optim_memory", "prepared", "scaling_iterations", "sweep",
               "time_to_accuracy", "workers"}
    assert scripts == modules, "a script of bench/ that python -m bench cannot run"


def test_a_script_runs_through_the_entry_point_from_another_folder(tmp_path):
    """``python -m bench NAME`` runs bench/NAME.py with its own options, the checkout
    (not the current folder) providing ``bench``."""
    proc = subprocess.run([sys.executable, "-m", "bench", "dash_reference", "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m bench dash_reference")


def test_bad_input_is_refused_before_any_work(monkeypatch, capsys):
    import bench.optim
    import bench.solvers

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the input was checked")

    for module in (bench.optim, bench.solvers):
        monkeypatch.setattr(module, "run", no_work)
    one_line_error(capsys, "optim", "--steps", "0")
    one_line_error(capsys, "solvers", "--repeats", "0")


def test_missing_matplotlib_is_one_line_before_work(monkeypatch, capsys):
    import matroot.cli.common as common

    real = common.importlib.util.find_spec
    monkeypatch.setattr(common.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert "needs matplotlib" in one_line_error(capsys, "solvers", "--smoke", "--out", "x")


def test_writing_into_the_package_is_refused(capsys):
    import matroot

    inside = str(Path(matroot.__file__).parent / "results")
    line = one_line_error(capsys, "solvers", "--smoke", "--out", inside)
    assert "inside the installed matroot package" in line


def test_sweep_summary_line_leaves_out_what_was_not_measured():
    from bench.cli import _summary_line

    row = dict(backend="numpy", n=512, batch=2, p=2, fastest="eigh_batched",
               fastest_matmul_method=None, fastest_matmul_method_vs_eigh_batched=None,
               fastest_matmul_method_vs_eigh_loop=None, eigh_in_matmuls=None)
    line = _summary_line(row)
    assert line.endswith("fastest eigh_batched")
    assert "None" not in line and "n/a" not in line
    line = _summary_line(dict(row, fastest_matmul_method="minimax", eigh_in_matmuls=16.0,
                              fastest_matmul_method_vs_eigh_batched=2.5,
                              fastest_matmul_method_vs_eigh_loop=2.6))
    assert "best matmul method minimax at 2.5x batched eigh" in line
    assert line.endswith("eigh = 16 matmuls")


# Odd but plausible arguments a user passed, each a test that failed before its fix.

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
    assert fragment in one_line_error(capsys, verb, str(path), "--out", str(tmp_path / "out"))
    assert not (tmp_path / "out" / "summary.md").exists()


def test_bench_report_reads_a_solvers_json(tmp_path):
    path = tmp_path / "solvers.json"
    path.write_text(json.dumps({"schema": "matroot.bench.solvers/1", "config": {}}))
    assert main(["report", str(path)]) == 0
    assert (tmp_path / "summary.md").exists()


def test_infinite_options_are_refused_before_any_work(capsys):
    line = one_line_error(capsys, "solvers", "--smoke", "--kappa", "inf")
    assert "--kappa must be a finite number" in line


@pytest.mark.parametrize("preset, n, batches", [
    ("smoke", 1, (2,)),      # was (2097152,): minutes of a "seconds" preset
    ("quick", 2, (8,)),
    ("full", 64, (512,)),  # the full run keeps its memory-filling default
])
def test_quick_presets_keep_their_scale_for_other_sizes(preset, n, batches):
    from bench.cli import solvers_config

    argv = ["solvers", *([] if preset == "full" else [f"--{preset}"]), "--sizes", str(n)]
    assert solvers_config(build_parser().parse_args(argv)).batches[n] == batches
