"""Smoke tests of the optimizer-step benchmark and the digits example (tiny settings)."""

import json
import pathlib
import sys

import pytest

pytest.importorskip("torch")

from matroot.bench import optim as bench

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def test_benchmark_reports_both_layouts_and_their_ratio(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "model_shapes",
                        lambda quick: [(40, 24), (24,), (30, 3, 2, 2), (24, 40)])
    out = tmp_path / "optim_test.json"
    assert bench.main(["--quick", "--steps", "2", "--warmup", "1", "--block-size", "16",
                       "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    stacked, single = report["results"]["stacked"], report["results"]["per_block"]
    assert stacked["inv_root_calls_per_refresh"] < single["inv_root_calls_per_refresh"]
    assert stacked["state_bytes"] == single["state_bytes"]
    assert report["speedup_stacked_over_per_block"] == pytest.approx(
        single["step_ms"] / stacked["step_ms"])
    for r in (stacked, single):
        assert set(r["split_ms"]) == {"factor_updates", "inverse_roots", "rest"}
        assert sum(r["split_ms"].values()) <= r["step_ms"] * 1.01
        assert r["root_failures"] == 0
    assert "speedup" in capsys.readouterr().out
    assert out.with_suffix(".md").exists()


def test_digits_example_quick_run_writes_its_results(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("train_digits", None)
    import train_digits

    monkeypatch.setattr(train_digits, "OPTIMIZERS", {
        "AdamW": None, "Shampoo (evd)": dict(root_method="evd")})
    assert train_digits.main(["--steps", "20", "--seeds", "1", "--lrs", "0.01",
                              "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "digits_summary.json").read_text())
    assert set(summary["results"]) == {"AdamW", "Shampoo (evd)"}
    shampoo = summary["results"]["Shampoo (evd)"]
    assert shampoo["root_refreshes"] == 2 and shampoo["root_failures"] == 0
    assert len(shampoo["train_loss"]) == 2
    assert (tmp_path / "digits_loss.png").stat().st_size > 10_000
