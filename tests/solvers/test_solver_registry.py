"""The solver registry: a solver registered from outside appears everywhere with no other edit."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import matroot
from matroot.testing.backends import Target
from matroot.cli.info import collect, format_info
from matroot.solvers import SOLVERS, SolverOutput
from matroot.solvers.auto import accelerator_candidates
from matroot.solvers.registry import (
    INTEGER_P,
    SolverSpec,
    register_solver,
    solvers_supporting,
    unregister_solver,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs"))
registry_tables = pytest.importorskip("registry_tables")


def _toy_solve(a, p, *, matmul, **_):
    """A toy: the exact inverse root from a float64 eigh, reporting 5 "matmuls"."""
    xp = matroot._xp.array_namespace(a)
    lam, q = np.linalg.eigh(matroot._xp.to_numpy(a).astype(np.float64))
    root = (q * lam[:, None, :] ** (-1.0 / p)) @ np.swapaxes(q, -1, -2)
    b = a.shape[0]
    dev = matroot._xp.device_of(a)
    zeros = xp.zeros((b,), dtype=a.dtype, device=dev)
    count = xp.full((b,), 5, dtype=xp.int32, device=dev)
    return SolverOutput(matroot._xp.from_numpy(xp, root, dtype=a.dtype, device=dev), zeros,
                        count, xp.ones((b,), dtype=xp.bool, device=dev), count)


TOY = SolverSpec(
    name="toy_solver",
    solve=_toy_solve,
    summary="a test's toy, cheaper than every real method",
    root_orders=INTEGER_P,
    default_tol={"float32": 1e-3, "float64": 1e-9},
    default_max_iter=7,
    cost=lambda p, kappa: 1.0,
    cost_summary="one per call",
    matmul_dtypes=(None, "float16"),
)


@pytest.fixture
def toy():
    register_solver(TOY)
    yield TOY
    unregister_solver(TOY.name)


def test_toy_solver_is_validated_defaulted_and_run(toy):
    a = np.diag([4.0, 16.0])
    res = matroot.inv_root_info(a, 2, method="toy_solver")
    assert res.method == "toy_solver"
    np.testing.assert_allclose(res.root, np.diag([0.5, 0.25]))
    assert matroot.default_tol("toy_solver", "float32") == 1e-3
    assert matroot.default_max_iter("toy_solver") == 7
    assert "toy_solver" in solvers_supporting(3)
    assert "toy_solver" not in solvers_supporting(0.5)
    with pytest.raises(ValueError, match=r"'toy_solver' does not support p=0\.5; .*'evd'"):
        matroot.inv_root(a, 0.5, method="toy_solver")
    with pytest.raises(ValueError, match="'toy_solver'"):
        matroot.inv_root(a, 2, method="no_such_solver")
    with pytest.raises(ValueError, match=r"method=\['evd'\] is not one of 'auto', 'evd'"):
        matroot.inv_root(a, 2, method=["evd"])
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="'toy_solver' does not take matmul_dtype='bfloat16'"):
        matroot.inv_root(torch.eye(2), 2, method="toy_solver", matmul_dtype="bfloat16")


def test_toy_solver_is_auto_candidate(toy):
    assert accelerator_candidates(2)[0] == "toy_solver"
    assert accelerator_candidates(3)[0] == "toy_solver"
    torch = pytest.importorskip("torch")
    from array_api_compat import array_namespace

    # The accelerator default is the method measured fastest on a GPU, not the
    # cost model's first candidate: registering a cheap solver does not change it.
    on_accelerator = torch.empty(2, 8, 8, device="meta")
    assert matroot.choose_method(array_namespace(on_accelerator), on_accelerator,
                                 4) == "coupled_newton"


def test_toy_solver_in_info_and_support_table(toy):
    data = collect(targets=[Target("numpy", "cpu")], methods=None)
    assert data["p_support"]["toy_solver"] == [1, 2, 3, 4, 8]
    statuses = {s["precision"]: s["status"] for s in data["support"]
                if s["method"] == "toy_solver"}
    assert statuses == {"float64": "yes", "float32": "yes", "float16 matmuls": "yes",
                        "bfloat16 matmuls": "unsupported"}
    assert re.search(r"toy_solver +a test's toy", format_info(data))
    rows = {r["precision"]: r for r in registry_tables.support_rows()
            if r["method"] == "toy_solver"}
    assert rows["float16 matmuls"]["numpy"] == "emulated"
    assert rows["bfloat16 matmuls"]["torch (CUDA)"] == "no"
    assert "``toy_solver``" in registry_tables.solvers_table_rst()


def test_registry_refuses_duplicates_and_auto():
    with pytest.raises(ValueError, match="already registered"):
        register_solver(SOLVERS["evd"])
    with pytest.raises(ValueError, match="cannot name a solver"):
        register_solver(SolverSpec(**{**_fields(TOY), "name": "auto"}))
    with pytest.raises(ValueError, match="default_tol needs keys among"):
        register_solver(SolverSpec(**{**_fields(TOY), "default_tol": {"float16": 1e-2}}))
    with pytest.raises(ValueError, match="default_max_iter must be a positive integer"):
        register_solver(SolverSpec(**{**_fields(TOY), "default_max_iter": 0}))
    assert TOY.name not in SOLVERS


def _fields(spec):
    return {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k != "compute_dtypes"}


def test_every_spec_is_consistent():
    for name, spec in SOLVERS.items():
        assert spec.name == name
        assert set(spec.compute_dtypes) <= {"float32", "float64"}
        assert spec.default_max_iter >= 1
        assert spec.cost(4, 1e4) >= 0
        assert spec.summary and spec.cost_summary


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_cost_models_match_measured_matmuls(p):
    """Each matmul solver's cost model is within 40% of what it spends at the κ that
    ``auto`` ranks by, and the cheapest by the model is the cheapest measured."""
    from matroot.solvers.auto import REFERENCE_KAPPA
    from matroot.testing import spd_stack

    a = spd_stack(np.random.default_rng(0), (4,), 96, REFERENCE_KAPPA)[0].astype(np.float32)
    measured = {}
    for name in accelerator_candidates(p):
        res = matroot.inv_root_info(a, p, method=name)
        if not bool(np.all(res.converged)):
            continue  # e.g. chebyshev's degree cap: the model says too costly anyway
        measured[name] = int(np.max(res.matmuls))
        ratio = measured[name] / SOLVERS[name].cost(p, REFERENCE_KAPPA)
        assert 1 / 1.4 <= ratio <= 1.4, (name, measured[name], ratio)
    assert accelerator_candidates(p)[0] == min(measured, key=measured.get)
