"""The solver benchmark's smallest run: its JSON has every field, and its errors are real.

No timing is asserted (timings are noisy); the errors are checked against an
oracle computed here, independently of the benchmark's own.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import matroot
from matroot.solvers import SOLVERS
from matroot.solvers.registry import solvers_supporting
from matroot.testing import scaled_spd_stack

from bench.__main__ import main
from bench.config import BASELINES, PRESETS

SWEEP_FIELDS = {
    "backend", "device", "n", "batch", "p", "kappa", "dtype", "method", "kind", "seed",
    "time_s", "times_s", "first_call_s", "matmul_time_s", "matmul_equivalents",
    "efficiency", "matmuls", "iterations", "err_max", "err_median", "residual",
    "converged", "ratio_to_eigh_batched", "ratio_to_eigh_loop",
}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # Two backends show the workers' bookkeeping; a JAX worker runs the same code and
    # would double the module's CPU time with its per-method compiles.
    status = main(["solvers", "--smoke", "--backends", "numpy", "torch",
                   "--out", str(out)])
    assert status == 0
    return out, json.loads((out / "solvers.json").read_text())


def _own_error(root, a, p):
    lam, q = np.linalg.eigh(a.astype(np.float64))
    exact = (q * lam[:, None, :] ** (-1.0 / p)) @ np.swapaxes(q, -1, -2)
    diff = np.asarray(root, dtype=np.float64) - exact
    return np.linalg.norm(diff, axis=(-2, -1)) / np.linalg.norm(exact, axis=(-2, -1))


def test_sweep_has_every_contender_and_field(smoke):
    _, doc = smoke
    config = PRESETS["smoke"]
    assert doc["schema"] == "matroot.bench.solvers/1"
    assert doc["machine"]["cpu_count"] >= 1 and doc["machine"]["workers"]
    assert "numpy" in doc["backends"]
    skipped = {(s["backend"], s["n"], s["batch"], s["p"], s["method"])
               for s in doc["skipped"]}
    for backend in doc["backends"]:
        for p in config.ps:
            rows = [r for r in doc["sweep"] if r["backend"] == backend and r["p"] == p]
            methods = {r["method"] for r in rows}
            expected = {m for m in SOLVERS if m in solvers_supporting(p)} | set(BASELINES)
            expected -= {s[-1] for s in skipped if s[0] == backend and s[3] == p}
            assert methods == expected
            for r in rows:
                assert SWEEP_FIELDS <= set(r), SWEEP_FIELDS - set(r)
                assert len(r["times_s"]) == config.repeats
                assert r["time_s"] > 0 and r["matmul_time_s"] > 0
                assert (r["efficiency"] is None) == (r["matmuls"] == 0)
                assert r["kind"] == ("baseline" if r["method"] in BASELINES else "matroot")
            batched = next(r for r in rows if r["method"] == "eigh_batched")
            assert batched["ratio_to_eigh_batched"] == pytest.approx(1.0)
    assert {(r["backend"], r["p"]) for r in doc["sweep_summary"]} == {
        (b, p) for b in doc["backends"] for p in config.ps}


def test_sweep_errors_are_oracle_errors(smoke):
    _, doc = smoke
    for r in doc["sweep"]:
        if r["method"] in ("evd", "newton_db", "coupled_newton"):
            # κ = 1e4 at the default tolerance: the accuracy table's levels.
            assert r["err_max"] is not None and r["err_max"] < 1e-3, r
            assert r["err_median"] <= r["err_max"]
        if r["method"] == "evd":
            assert r["err_max"] < 1e-5, r  # float64 eigh inside
    numpy_rows = [r for r in doc["sweep"] if r["backend"] == "numpy"
                  and r["method"] == "newton_db" and r["p"] == 2]
    r = numpy_rows[0]
    a = scaled_spd_stack(r["batch"], r["n"], r["kappa"], seed=r["seed"], dtype=np.float32)
    res = matroot.inv_root_info(a, 2, method="newton_db")
    # Same input, same library: the same error up to rounding-level differences.
    assert r["err_max"] == pytest.approx(_own_error(res.root, a, 2).max(), rel=1e-2)
    assert r["matmuls"] == int(np.max(res.matmuls))


def test_time_to_accuracy_records_truncated_runs(smoke):
    _, doc = smoke
    curves = [c for c in doc["time_to_accuracy"] if c["method"] == "newton_db"]
    assert curves
    for curve in curves:
        swept = [pt for pt in curve["points"] if not pt["default"]]
        assert [pt["setting"] for pt in swept][:3] == [1, 2, 3]
        first, best = swept[0]["err_max"], min(pt["err_max"] for pt in swept)
        assert first > 1e-2 > best  # one step is far off; the sweep converges
        assert [pt["matmuls"] for pt in swept] == sorted(pt["matmuls"] for pt in swept)
        a = scaled_spd_stack(curve["batch"], curve["n"], curve["kappa"], seed=curve["seed"],
                             dtype=np.float32)
        if curve["backend"] in ("numpy", "torch-cpu"):
            res = matroot.inv_root_info(a, curve["p"], method="newton_db", tol=0.0,
                                        max_iter=2)
            own = _own_error(res.root, a, curve["p"]).max()
            assert swept[1]["err_max"] == pytest.approx(own, rel=1e-3)
    summary = doc["time_to_accuracy_summary"]
    assert any(row["method"] == "newton_db" and row["reached"] for row in summary)


def test_scaling_compares_both_scalings(smoke):
    _, doc = smoke
    rows = doc["scaling"]
    keys = {(r["spectrum"], r["kappa"], r["p"], r["method"]) for r in rows}
    for key in keys:
        pair = {r["scaling"]: r for r in rows
                if (r["spectrum"], r["kappa"], r["p"], r["method"]) == key}
        assert set(pair) == {"power", "frobenius"}
        # Frobenius over-estimates λmax, which never saves an iteration.
        assert pair["frobenius"]["iterations"] >= pair["power"]["iterations"]
        assert pair["power"]["frobenius_over_lambda_max"] >= 1.0


def test_plots_are_written_from_the_json(smoke, tmp_path):
    out, _ = smoke
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "scaling_iterations.png" in pngs and "sweep_efficiency.png" in pngs
    assert main(["plots", str(out / "solvers.json"), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == pngs
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in pngs)


def test_report_is_rewritten_from_the_json(smoke, tmp_path):
    out, doc = smoke
    assert main(["report", str(out / "solvers.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "summary.md").read_text() == (out / "summary.md").read_text()


def test_run_records_its_thread_policy(smoke):
    _, doc = smoke
    assert doc["threads"]["threads"] == 1
    assert all(w["threads"] == 1 for w in doc["machine"]["workers"])
    assert doc["machine"]["worker_environment"]["OMP_NUM_THREADS"] == "1"
