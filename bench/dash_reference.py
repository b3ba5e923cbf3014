"""Time to a relative error of 5e-3 and 1e-3: matroot against DASH's own solvers.

DASH (``ista-daslab-optimizers`` on PyPI, IST Austria) ships Newton-DB and coupled
Newton in float32 with a fixed step count. Its package imports CUDA extensions and
Triton kernels at the top, so only its solver files are loaded here, with empty
stand-ins for the packages above them (:func:`load_dash_solvers`); they run on the
CPU unchanged. When the wheel is not importable the comparison is skipped.

For each (κ, p, goal), every contender's *fastest configuration that reaches the
goal on every matrix* (against the float64 oracle) is timed, side by side
(DASH rounds its scale's square root to bfloat16, which leaves its roots about
2e-3 off whatever the step count, so 1e-3 is out of its reach):
DASH Newton-DB and coupled Newton with the fewest ``newton_steps`` that reach it;
matroot's solvers with ``tol`` equal to the goal or at its default (evd then
keeps its float32 eigh wherever that meets the goal). Run
``python bench/dash_reference.py [--quick]`` from anywhere; results go to
``bench/results/dash_reference.{json,md}`` beside this script (``--out`` to change).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import statistics
import sys
import types
from pathlib import Path

import numpy as np

import matroot
from matroot.bench.problems import spd_stack
from matroot.bench.timing import interleaved_times, timed_call
from matroot.testing import SPDCase, relative_error

RESULTS = Path(__file__).resolve().parent / "results"
#: DASH step counts tried, smallest first.
DASH_STEPS = (4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 20, 24)
_PACKAGE = "ista_daslab_optimizers"


def load_dash_solvers():
    """DASH's solver classes and config, or None when the wheel is not installed.

    The package's ``__init__`` files import CUDA and Triton code; they are
    replaced by empty packages that only point at the real directories, and the
    Triton helper the float32 solvers never call by an empty module.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, folder in ((_PACKAGE, root), (f"{_PACKAGE}.dash", root / "dash"),
                         (f"{_PACKAGE}.dash.invertors", root / "dash" / "invertors"),
                         (f"{_PACKAGE}.utils", root / "utils")):
        stand_in = types.ModuleType(name)
        stand_in.__path__ = [str(folder)]
        sys.modules.setdefault(name, stand_in)
    triton_helper = types.ModuleType(f"{_PACKAGE}.utils.newton_schulz_triton")
    triton_helper.ns_line_1 = None
    sys.modules.setdefault(triton_helper.__name__, triton_helper)
    config = importlib.import_module(f"{_PACKAGE}.dash.dash_config")
    ndb = importlib.import_module(f"{_PACKAGE}.dash.invertors.inv_ndb")
    cn = importlib.import_module(f"{_PACKAGE}.dash.invertors.inv_cn")
    return config.DashConfig, ndb.DashRootInvNewtonDB, cn.DashRootInvCoupledNewton


def _dash_call(dash, name, a, p, eps, steps):
    import torch

    config_type, ndb, cn = dash
    cfg = config_type(eps_inv_root=eps, newton_steps=steps, cn_tolerance=0.0,
                      matmul_dtype=torch.float32)
    solve = (ndb._matrix_root_inv_newton_db if name == "newton_db"
             else cn._matrix_root_inv_coupled_newton)

    def call():
        out = torch.empty_like(a)
        solve(inp=a, out=out, cfg=cfg, root=p)
        return out

    return call


def _fastest_config(candidates, exact, goal):
    """The first candidate (cheapest first) whose roots all meet ``goal``."""
    for label, call in candidates:
        if np.all(relative_error(call(), exact) <= goal):
            return label, call
    return None


def compare(kappas, orders, goals, *, n=384, batch=8, repeats=3, budget_s=20.0):
    """Rows of time ratios (contender ÷ DASH's fastest) per (κ, p, goal)."""
    import torch

    torch.set_num_threads(1)
    dash = load_dash_solvers()
    if dash is None:
        print("ista-daslab-optimizers is not importable: DASH comparison skipped")
        return []
    torch.manual_seed(0)  # DASH's power iteration draws its start vector
    rows = []
    for kappa in kappas:
        host = spd_stack(n, batch, kappa, seed=1).astype(np.float32)
        a = torch.asarray(host)
        eps = 0.0
        oracle = SPDCase(host.astype(np.float64), eps, "geometric")
        for p in orders:
            exact = oracle.inv_root(p)
            for goal in goals:
                contenders = {}
                for name in ("newton_db", "coupled_newton"):
                    found = _fastest_config(
                        [(f"DASH {name} ×{s}", _dash_call(dash, name, a, p, eps, s))
                         for s in DASH_STEPS], exact, goal)
                    if found:
                        contenders[found[0]] = found[1]
                    else:
                        rows.append({"kappa": kappa, "p": p, "goal": goal,
                                     "contender": f"DASH {name}: no step count up to "
                                                  f"{DASH_STEPS[-1]} reaches the goal",
                                     "time_over_dash_best": None})
                for method in ("minimax", "coupled_newton", "newton_db", "evd"):
                    tols = (goal, None)
                    found = _fastest_config(
                        [(f"matroot {method}" + ("" if tol is None else f" tol={tol:g}"),
                          lambda a=a, p=p, eps=eps, method=method, tol=tol: matroot.inv_root(
                              a, p, method=method, eps=eps, tol=tol))
                         for tol in tols], exact, goal)
                    if found:
                        contenders[found[0]] = found[1]
                calls = {key: (fn, timed_call(fn, lambda: None)[0])
                         for key, fn in contenders.items()}
                times = interleaved_times(calls, lambda: None, repeats=repeats,
                                          budget_s=budget_s)
                medians = {key: statistics.median(t) for key, t in times.items()}
                dash_times = [t for key, t in medians.items() if key.startswith("DASH")]
                dash_best = min(dash_times) if dash_times else None
                for key, t in medians.items():
                    ratio = None if dash_best is None else t / dash_best
                    rows.append({"kappa": kappa, "p": p, "goal": goal, "contender": key,
                                 "time_over_dash_best": ratio})
                    print(f"κ={kappa:.0e} p={p} goal={goal:g} {key:32s} "
                          f"{'-' if ratio is None else f'{ratio:.2f}'}× DASH's fastest",
                          flush=True)
    return rows


def _markdown(rows, what):
    lines = ["# Time to accuracy against DASH's solvers", "", what, "",
             "| κ | p | goal | contender (fastest configuration) | time ÷ DASH's fastest |",
             "|---|---|---|---|---|"]
    for r in rows:
        ratio = r["time_over_dash_best"]
        lines.append(f"| {r['kappa']:.0e} | {r['p']} | {r['goal']:g} | {r['contender']} | "
                     f"{'—' if ratio is None else f'{ratio:.2f}'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Run the comparison and write ``bench/results/dash_reference.{json,md}``."""
    parser = argparse.ArgumentParser(prog="python bench/dash_reference.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 128, κ = 1e2 only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    n = 128 if args.quick else 384
    rows = compare((1e2,) if args.quick else (1e2, 1e4), (2, 4), (5e-3, 1e-3), n=n)
    if not rows:
        return 0
    what = (f"8 × {n}² float32 SPD stacks with geometric spectra, torch CPU, one thread; "
            "medians of interleaved runs, as ratios to DASH's fastest configuration")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dash_reference.json").write_text(
        json.dumps({"what": what, "rows": rows}, indent=1) + "\n")
    (args.out / "dash_reference.md").write_text(_markdown(rows, what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
