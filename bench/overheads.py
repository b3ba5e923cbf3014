"""What a solver costs beyond its matmuls, and what evd costs beyond one eigh.

Two ratios, each measured side by side in one run (interleaved, medians), never
absolute times:

- **floor**: the time of a whole ``inv_root_info`` call (validation, λmax and λmin
  estimates, the iteration, its checks) divided by the time of the matmuls it
  reports (``k`` batched ``a @ a`` products of the same shape, ``k`` = its
  ``matmuls``). 1.0 would be a solver that is nothing but its products. Also
  the quantity issue 21 bounds by 1.25: the call's time ÷ (its counted
  product-equivalents, ``matmuls + check_matmuls``, × one product).
- **evd**: ``inv_root(method="evd")`` divided by a plain float32 eigh root
  ``Q diag(λ^(-1/p)) Qᵀ`` of the same stack on the same backend, for small and
  large matrices; on well-conditioned stacks (float32 meets the accuracy table)
  and at κ = 1e4 (evd then solves in float64, as the table needs).

Run ``python -m bench overheads [--quick]`` from the repository root; results go to
``bench/results/overheads.{json,md}`` beside this script (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

import matroot
from matroot.cli.timing import interleaved_times, timed_call
from matroot.solvers import SOLVERS
from matroot.testing import scaled_spd_stack

RESULTS = Path(__file__).resolve().parent / "results"
#: (batch, n) of the evd comparison: the issue's small-batch shapes and one large one.
EVD_SHAPES = [(10000, 4), (4096, 8), (256, 32), (16, 256)]


def _torch_namespace():
    import torch

    torch.set_num_threads(1)
    return torch


def _median_ratio(times, numerator, denominator):
    return statistics.median(times[numerator]) / statistics.median(times[denominator])


def matmul_floor_rows(sizes, kappas, orders, *, batch=8, repeats=3, budget_s=20.0):
    """Per (n, κ, p, method): matmuls and whole-call time ÷ matmul floor (torch CPU)."""
    torch = _torch_namespace()
    methods = [name for name, spec in SOLVERS.items()
               if spec.iterative and spec.forms_matmuls and name != "chebyshev"]
    rows = []
    for n in sizes:
        for kappa in kappas:
            a = torch.asarray(scaled_spd_stack(batch, n, kappa, seed=n).astype(np.float32))
            for p in orders:
                for method in methods:
                    for eps in (0.0, 1.0 / kappa):
                        def call(a=a, p=p, method=method, eps=eps):
                            return matroot.inv_root_info(a, p, method=method, eps=eps)

                        first, res = timed_call(call, lambda: None)
                        k = int(res.matmuls.max())
                        counted = float((res.matmuls + res.check_matmuls).max())

                        def floor(a=a, k=k):
                            for _ in range(k):
                                a @ a

                        floor_first, _ = timed_call(floor, lambda: None)
                        times = interleaved_times({"solver": (call, first),
                                                   "floor": (floor, floor_first)},
                                                  lambda: None, repeats=repeats,
                                                  budget_s=budget_s)
                        over_floor = _median_ratio(times, "solver", "floor")
                        rows.append({"n": n, "batch": batch, "kappa": kappa, "p": p,
                                     "method": method, "eps": eps, "matmuls": k,
                                     "counted": counted, "time_over_floor": over_floor,
                                     "time_over_counted": over_floor * k / counted})
                        print(f"floor n={n} κ={kappa:.0e} p={p} {method:15s} "
                              f"eps={eps:.0e}: {k:3d} matmuls, {counted:5.1f} counted, "
                              f"{over_floor:.2f}× floor, "
                              f"{rows[-1]['time_over_counted']:.2f}× counted", flush=True)
    return rows


def _plain_eigh_root(xp, a, p):
    lam, q = xp.linalg.eigh(a)
    weights = xp.where(lam > 0, lam, xp.ones_like(lam)) ** (-1.0 / p)
    return (q * weights[..., None, :]) @ xp.matrix_transpose(q)


def evd_rows(shapes, *, p=4, repeats=5, budget_s=5.0):
    """Per (backend, batch, n, spectrum): evd time ÷ plain float32 eigh root time."""
    import array_api_compat.numpy as np_xp

    torch = _torch_namespace()
    import array_api_compat.torch as torch_xp

    rows = []
    for backend, xp, convert in (("torch", torch_xp, torch.asarray),
                                 ("numpy", np_xp, np.asarray)):
        for batch, n in shapes:
            rng = np.random.default_rng(n)
            g = rng.standard_normal((batch, n, 2 * n))
            wishart = g @ np.swapaxes(g, -1, -2) / n  # κ ≈ 34: float32 suffices
            for spectrum, host in (("wishart", wishart),
                                   ("kappa1e4", scaled_spd_stack(batch, n, 1e4, seed=n))):
                a = convert(host.astype(np.float32))
                calls = {"evd": lambda a=a: matroot.inv_root(a, p, method="evd"),
                         "eigh": lambda a=a, xp=xp: _plain_eigh_root(xp, a, p)}
                calls = {key: (fn, timed_call(fn, lambda: None)[0])
                         for key, fn in calls.items()}
                times = interleaved_times(calls, lambda: None, repeats=repeats,
                                          budget_s=budget_s)
                rows.append({"backend": backend, "batch": batch, "n": n, "p": p,
                             "spectrum": spectrum,
                             "evd_over_eigh": _median_ratio(times, "evd", "eigh")})
                print(f"evd {backend} {batch}×{n}² {spectrum}: "
                      f"{rows[-1]['evd_over_eigh']:.2f}× a float32 eigh root", flush=True)
    return rows


def _markdown(result):
    load = ", ".join(f"{result[k][0]:.1f}" for k in ("load_average_before",
                                                        "load_average_after") if k in result)
    lines = ["# Solver overheads (ratios measured side by side)", "",
             f"Load average (1 min) before and after the run: {load or 'not recorded'}.", "",
             "## Whole inv_root_info call ÷ its own matmul floor (torch CPU, float32)", "",
             "time ÷ counted: the call's time ÷ (matmuls + check_matmuls) products.", "",
             "| n | κ | p | method | eps | matmuls | counted | time ÷ floor "
             "| time ÷ counted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["floor"]:
        lines.append(f"| {r['n']} | {r['kappa']:.0e} | {r['p']} | {r['method']} | "
                     f"{r['eps']:.0e} | {r['matmuls']} | {r['counted']:.1f} | "
                     f"{r['time_over_floor']:.2f} | {r['time_over_counted']:.2f} |")
    lines += ["", "## evd ÷ a plain float32 eigh root (same backend, p = 4)", "",
              "| backend | batch × n² | spectrum | evd ÷ eigh root |", "|---|---|---|---|"]
    for r in result["evd"]:
        lines.append(f"| {r['backend']} | {r['batch']} × {r['n']}² | {r['spectrum']} | "
                     f"{r['evd_over_eigh']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Run both comparisons and write ``bench/results/overheads.{json,md}``."""
    parser = argparse.ArgumentParser(prog="python -m bench overheads",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 256 only, fewer repeats")
    parser.add_argument("--out", type=Path, default=RESULTS)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    sizes = (256,) if args.quick else (256, 512)
    result = {
        "what": "time ratios on this machine, one BLAS thread, medians of interleaved runs",
        # Other jobs on a shared machine move the ratios: say how busy it was.
        "load_average_before": os.getloadavg(),
        "floor": matmul_floor_rows(sizes, (1e2, 1e4), (2, 4),
                                   repeats=2 if args.quick else 3),
        "evd": evd_rows(EVD_SHAPES[:2] if args.quick else EVD_SHAPES,
                        repeats=3 if args.quick else 5),
    }
    result["load_average_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overheads.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "overheads.md").write_text(_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
