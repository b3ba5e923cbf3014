"""Smoke tests of the overhead and DASH benchmarks (tiny sizes; ratios are not asserted)."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("torch")

from matroot.bench import dash_reference, overheads


def test_floor_and_evd_rows(tmp_path):
    floor = overheads.matmul_floor_rows((32,), (1e2,), (2,), batch=2, repeats=1,
                                        budget_s=0.1)
    assert {r["method"] for r in floor} == {"newton_db", "coupled_newton", "minimax"}
    assert all(r["matmuls"] > 0 and r["time_over_floor"] > 0 for r in floor)
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
