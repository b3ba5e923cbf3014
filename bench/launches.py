"""``python -m bench launches``: operations and host syncs per solve, counted through torch's
dispatcher (issue 35's definition, :mod:`matroot.testing.launch_count`).

On a GPU every counted operation is about one kernel launch, and at the sizes an
optimizer's blocks have (up to ~1024) a solve's time is mostly launches. Counted on
the CPU the numbers are exact and the same on every run. For one float32 stack
(default 8 × 384², a geometric spectrum with κ = 1e4) and an accuracy target ``rtol``,
each row is one contender's solve, its error against a float64 oracle and whether it
met the target:

- matroot's iterative methods with the fixed-step rule (``steps="fixed"``, what an
  accelerator runs for a call with ``rtol``), with the verdict read on the host (one
  sync) and left on the device (``verdict="device"``, none);
- the same methods with the adaptive loop (``steps="adaptive"``), as before issue 35;
- DASH's Newton-DB and coupled Newton, each with its power-iteration and its
  Frobenius scaling, at the fewest steps that reach ``rtol`` (:mod:`bench.dash`;
  skipped when the wheel is not installed);
- one optimizer step, between refreshes and at a refresh, of AdamW(foreach) and
  matroot's Shampoo on :mod:`bench.optim_launches`' model (issue 35's
  optimizer half).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import matroot
from matroot.testing import oracle_inv_root, relative_error

from .dash import DASH_SOLVERS, DASH_STEPS, dash_call, load_dash_solvers

__all__ = ["format_table", "run", "step_rows"]

#: The methods counted, each as the call an accelerator makes with ``rtol``.
METHODS = ("minimax", "newton_db", "coupled_newton")



def step_rows() -> list[dict]:
    """The optimizer step's counts as rows of the solve table (``p``, ``error`` and
    ``met`` None): one row per optimizer, model and kind of step."""
    from .optim_launches import step_rows as counted_steps

    rows = []
    for r in counted_steps():
        for kind in ("between", "refresh"):
            ops, syncs = r[kind]
            rows.append({"p": None, "contender": f"{r['optimizer']} step, {r['layers']} "
                         f"layers, {'between refreshes' if kind == 'between' else 'refresh'}",
                         "ops": ops, "syncs": syncs, "error": None, "met": None})
    return rows


def _stack(n: int, batch: int, kappa: float):
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((batch, n, n)))
    lam = np.geomspace(1.0, 1.0 / kappa, n)
    return (q * lam[None, None, :]) @ np.swapaxes(q, -1, -2)


def count(call: Callable):
    """``(ops, syncs, result)`` of the second of two calls (constants kept across calls,
    such as a cached identity, are then in place, as in a training loop)."""
    from matroot.testing.launch_count import LaunchCount

    call()
    with LaunchCount() as counted:
        out = call()
    return counted.ops, counted.syncs, out


def _row(contender, p, ops, syncs, root, exact, rtol, converged=None):
    error = float(np.max(relative_error(np.asarray(root.detach(), dtype=np.float64), exact)))
    return {"contender": contender, "p": p, "ops": ops, "syncs": syncs, "error": error,
            "met": error <= rtol, "converged": converged}


def _dash_rows(a, p, exact, rtol) -> list[dict]:
    dash = load_dash_solvers()
    if dash is None:
        return []
    import torch

    rows = []
    for name in DASH_SOLVERS:
        for frobenius in (False, True):
            label = f"DASH {name}, {'Frobenius' if frobenius else 'power'} scaling"
            for steps in DASH_STEPS:
                torch.manual_seed(0)  # DASH's power iteration draws its start vector
                ops, syncs, root = count(dash_call(dash, name, a, p, 0.0, steps,
                                                   frobenius=frobenius))
                error = relative_error(np.asarray(root, dtype=np.float64), exact)
                if float(np.max(error)) <= rtol:
                    rows.append(_row(f"{label} ×{steps}", p, ops, syncs, root, exact, rtol))
                    break
            else:
                rows.append({"contender": f"{label}: no step count up to {DASH_STEPS[-1]}",
                             "p": p, "ops": None, "syncs": None, "error": None,
                             "met": False, "converged": None})
    return rows


def run(*, orders=(2, 4), n: int = 384, batch: int = 8, kappa: float = 1e4,
        rtol: float = 5e-3, adaptive: bool = True, quick: bool = False) -> dict:
    """The report: one row per contender and p (see the module docstring)."""
    import torch

    host = _stack(n, batch, kappa)
    a = torch.asarray(host, dtype=torch.float32)
    rows = []
    for p in orders:
        exact = oracle_inv_root(host, p)
        for method in METHODS:
            for verdict in ("host", "device"):
                ops, syncs, res = count(lambda m=method, v=verdict, p=p: matroot.inv_root_info(
                    a, p, method=m, rtol=rtol, steps="fixed", verdict=v))
                rows.append(_row(f"matroot {method}, fixed steps, {verdict} verdict", p, ops,
                                 syncs, res.root, exact, rtol, bool(res.converged.all())))
            if adaptive:
                ops, syncs, res = count(lambda m=method, p=p: matroot.inv_root_info(
                    a, p, method=m, rtol=rtol, steps="adaptive"))
                rows.append(_row(f"matroot {method}, adaptive loop", p, ops, syncs, res.root,
                                 exact, rtol, bool(res.converged.all())))
        rows += _dash_rows(a, p, exact, rtol)
    rows += step_rows()
    return {"n": n, "batch": batch, "kappa": kappa, "rtol": rtol, "dtype": "float32",
            "rows": rows}


def format_table(report: dict) -> str:
    """A markdown table of a :func:`run` report, with each solve's ratio to the cheapest
    DASH solve for its p."""
    best: dict[int, int] = {}
    for r in report["rows"]:
        if r["contender"].startswith("DASH") and r["ops"] is not None:
            best[r["p"]] = min(best.get(r["p"], r["ops"]), r["ops"])
    lines = [f"Operations and host syncs per solve (torch dispatcher, CPU), float32 "
             f"{report['batch']} × {report['n']}², κ = {report['kappa']:g}, "
             f"rtol = {report['rtol']:g}", "",
             "| p | contender | ops | syncs | ops / DASH best | error | meets rtol |",
             "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        ratio = (f"{r['ops'] / best[r['p']]:.2f}" if r["ops"] is not None and r["p"] in best
                 else "-")
        error = "-" if r["error"] is None else f"{r['error']:.1e}"
        lines.append(f"| {r['p'] if r['p'] is not None else '-'} | {r['contender']} | "
                     f"{r['ops'] if r['ops'] is not None else '-'} | "
                     f"{r['syncs'] if r['syncs'] is not None else '-'} | {ratio} | {error} | "
                     f"{'-' if r['met'] is None else 'yes' if r['met'] else 'no'} |")
    return "\n".join(lines)
