"""``python -m bench polar`` on a tiny configuration: every contender, both parts, the CLI."""

from __future__ import annotations

import json

import pytest

from bench import polar as bench_polar
from matroot.testing.backends import select_targets

TINY = dict(shapes=((2, 12, 8),), kappas=(10.0,), width=8, layers=1, repeats=1,
            budget_s=0.01, fewest_shapes=((2, 12, 8),), fewest_kappas=(10.0,))


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(bench_polar.DEFAULTS, "quick", TINY)


def test_report_compares_every_contender(tiny):
    report = bench_polar.run(select_targets(["numpy"])[0], quick=True)
    rows = {r["contender"]: r for r in report["orthogonalization"]}
    quintic = rows["quintic (5 steps)"]
    assert quintic["products"] == 15 and not quintic["converged"]
    assert rows["svd"]["converged"] and rows["svd"]["time_vs_svd"] == 1.0
    for bound in ("gram_norm", "cholesky"):
        assert rows[f"polar_express (float32 rtol), {bound} bound"]["converged"]
    for label in ("polar_express (band lower) at the quintic's defect",
                  "polar_express (lower 1/κ) at the quintic's defect"):
        cut = rows[label]
        assert cut["defect"] <= quintic["defect"] and cut["products"] < quintic["products"]
    for bound in ("Gram-norm", "Cholesky"):
        default = rows[f"polar_express, Muon's default (4 steps, lower 0.0033), {bound} bound"]
        assert default["products"] == 12 and default["defect"] <= quintic["defect"]
    assert rows["rms_quintic (3 fitted steps), Cholesky bound"]["products"] == 9
    assert {r["contender"] for r in report["muon_step"]} == {"stacked", "per-parameter loop"}
    assert "| quintic (5 steps) |" in bench_polar.format_table(report)
    fewest = {(r["operands"], r["contender"]): r for r in report["fewest_products"]}
    assert {operands for operands, _ in fewest} == {"float32"}  # numpy has no bfloat16
    fitted = fewest["float32", "rms_quintic (3 fitted steps), Cholesky bound"]
    assert fitted["products"] == 9 and fitted["defect"] <= 0.3
    assert "| float32 | rms_quintic" in bench_polar.format_table(report)


def test_parts_run_alone(tiny):
    report = bench_polar.run(select_targets(["numpy"])[0], quick=True,
                             parts=("fewest_products",))
    assert "orthogonalization" not in report and "muon_step" not in report
    assert bench_polar.format_table(report).startswith("Fewest products")
    with pytest.raises(ValueError, match="unknown parts"):
        bench_polar.run(select_targets(["numpy"])[0], quick=True, parts=("nonesuch",))


def test_cli_writes_json_and_markdown(tiny, tmp_path):
    from bench.__main__ import main

    out = tmp_path / "polar.json"
    assert main(["polar", "--quick", "--backend", "numpy", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["backend"] == "numpy"
    assert out.with_suffix(".md").read_text().startswith("Orthogonalization")


@pytest.mark.parametrize("argv,fragment", [(["--backend", "nonesuch"], "nonesuch"),
                                           (["--threads", "-1"], "--threads"),
                                           (["--out", "/nonexistent/dir/polar.json"],
                                            "nonexistent")])
def test_cli_refuses_bad_input_before_work(monkeypatch, capsys, argv, fragment):
    from bench.__main__ import main

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the input was checked")

    monkeypatch.setattr(bench_polar, "run", no_work)
    assert main(["polar", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1
