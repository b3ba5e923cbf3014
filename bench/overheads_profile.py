"""Where a solve's time goes beyond its products: measured side by side in one run.

For each method, on one 8×384² float32 torch stack (by default):

- ``ratio``: the solve's time ÷ (its counted product-equivalents × one batched
  product), the quantity issue 21 asks to bring to ≤ 1.25;
- a profile of the call by phase: the Lanczos run, the λmax bound, the solver
  loop, the a-posteriori check, and the rest (validation, casts, scaling, small
  per-call operations). The phases are timed by wrapping the functions
  :mod:`matroot.roots` calls (the wrappers only time; they do not change them);
- the same call with the λmax bound made by the randomized Lanczos bound
  (:func:`matroot.lambda_max_bounds.randomized_lambda_max`, from the call's own
  Lanczos run) in place of the Cholesky-certified one: what the one-line change
  in ``roots.py`` (``certified_lambda_max(stack, estimate=top)`` →
  ``randomized_lambda_max(stack, ritz=ritz)``) would save.

With ``--evd``, evd against a plain float32 eigh root (``Q·diag(λ^(-1/p))·Qᵀ``)
on well-conditioned (κ = 10), moderate (κ = 1e2) and κ = 1e4 stacks, interleaved
(each round runs every variant once; the minimum over rounds is kept).

Run ``python bench/overheads_profile.py --help``; times are the minimum of
``--repeats`` runs; ratios, not absolute times, are the result.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np


def _best_of(call: Callable[[], object], repeats: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


class _PhaseClock:
    """Wraps named functions of a module so that each call adds its time to a phase."""

    def __init__(self):
        self.spent: dict[str, float] = defaultdict(float)
        self._undo: list = []
        self.last_ritz = None

    def wrap(self, module, name: str, phase: str, keep_ritz: bool = False):
        original = getattr(module, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = original(*args, **kwargs)
            self.spent[phase] += time.perf_counter() - start
            if keep_ritz:
                self.last_ritz = out
            return out

        setattr(module, name, timed)
        self._undo.append((module, name, original))

    def restore(self):
        for module, name, original in reversed(self._undo):
            setattr(module, name, original)
        self._undo.clear()


def _profiled_once(call, randomized: bool) -> dict[str, float]:
    """Phase times (seconds) of one inv_root_info call."""
    import matroot.roots as roots
    from matroot.lambda_max_bounds import randomized_lambda_max
    from matroot.solvers import registry

    clock = _PhaseClock()
    clock.wrap(roots, "ritz_values", "lanczos", keep_ritz=True)
    if randomized:
        def bound(stack, estimate=None, **_):
            return randomized_lambda_max(stack, ritz=clock.last_ritz)
        roots.certified_lambda_max = bound
    clock.wrap(roots, "certified_lambda_max", "lambda_max bound")
    clock.wrap(roots, "lambda_min_estimate_core", "lambda_min estimate")
    clock.wrap(roots, "check_root", "root check")
    spec = registry.get_solver(call.method)
    original_solve = spec.solve

    def solve(*args, **kwargs):
        start = time.perf_counter()
        out = original_solve(*args, **kwargs)
        clock.spent["solver loop"] += time.perf_counter() - start
        return out

    object.__setattr__(spec, "solve", solve)
    try:
        start = time.perf_counter()
        call()
        total = time.perf_counter() - start
    finally:
        object.__setattr__(spec, "solve", original_solve)
        clock.restore()
        roots.certified_lambda_max = _CERTIFIED
    phases = dict(clock.spent)
    phases["rest (validation, casts, scaling, small ops)"] = total - sum(phases.values())
    phases["total"] = total
    return phases


def _profile_variants(call, repeats: int) -> dict[str, dict[str, float]]:
    """Per λmax bound, the phases of the fastest of ``repeats`` calls, the two
    bounds interleaved (after one warm-up each)."""
    runs: dict[str, list[dict[str, float]]] = {"cholesky": [], "randomized": []}
    for round_ in range(repeats + 1):
        for variant, kept in runs.items():
            phases = _profiled_once(call, variant == "randomized")
            if round_:
                kept.append(phases)
    return {variant: min(kept, key=lambda phases: phases["total"])
            for variant, kept in runs.items()}


class _Call:
    def __init__(self, x, p, method):
        self.x, self.p, self.method = x, p, method

    def __call__(self):
        import matroot
        return matroot.inv_root_info(self.x, self.p, method=self.method)


_CERTIFIED = None


def _evd_ratios(batch: int, n: int, p: int, repeats: int) -> list[dict]:
    """evd's time, as the solver alone and through inv_root_info, ÷ a plain float32 eigh root."""
    import torch

    from matroot.testing import spd_stack

    rows = []
    for kappa in (10.0, 1e2, 1e4):
        a, _, _ = spd_stack(np.random.default_rng(1), (batch,), n, kappa, spread="uniform")
        variants = _evd_variants(torch.asarray(a, dtype=torch.float32), p)
        best = {name: float("inf") for name in variants}
        for _ in range(repeats + 1):
            for name, call in variants.items():
                start = time.perf_counter()
                call()
                best[name] = min(best[name], time.perf_counter() - start)
        base = best["plain float32 eigh root"]
        row = {"kappa": kappa, "ms": {k: v * 1e3 for k, v in best.items()},
               "ratio": {k: v / base for k, v in best.items()}}
        rows.append(row)
        print(f"evd κ={kappa:g} p={p}: " + ", ".join(f"{k} {v:.2f}x"
                                                   for k, v in row["ratio"].items())
              + f" (plain {base * 1e3:.1f} ms)")
    return rows


def _evd_variants(x, p: int) -> dict[str, Callable[[], object]]:
    import torch

    import matroot
    from matroot.solvers.evd import evd

    def plain():
        lam, q = torch.linalg.eigh(x)
        return (q * lam.clamp_min(1e-30).pow(-1.0 / p)[:, None, :]) @ q.mT

    return {"plain float32 eigh root": plain,
            "float64 eigh": lambda: torch.linalg.eigh(x.double()),
            "evd solver": lambda: evd(x, p),
            "inv_root_info(method='evd')": lambda: matroot.inv_root_info(x, p, method="evd")}


def main(argv=None) -> dict:
    global _CERTIFIED
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--n", type=int, default=384)
    parser.add_argument("--kappa", type=float, default=1e3)
    parser.add_argument("--p", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--methods", nargs="+", default=["newton_db", "coupled_newton", "minimax"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--evd", action="store_true", help="also time evd against a plain "
                        "float32 eigh root")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)

    import torch
    from threadpoolctl import threadpool_limits

    import matroot.roots as roots
    from matroot.testing import spd_stack

    _CERTIFIED = roots.certified_lambda_max
    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    rng = np.random.default_rng(0)
    a, _, _ = spd_stack(rng, (args.batch,), args.n, args.kappa, spread="uniform")
    x = torch.asarray(a, dtype=torch.float32)
    product = _best_of(lambda: x @ x, 3 * args.repeats)
    print(f"one batched product ({args.batch}×{args.n}², float32, {args.threads} threads): "
          f"{product * 1e3:.2f} ms")
    report: dict = {"product_ms": product * 1e3, "runs": []}
    for method in args.methods:
        for p in args.p:
            call = _Call(x, p, method)
            res = call()
            counted = float((res.matmuls + res.check_matmuls).max())
            for variant, phases in _profile_variants(call, args.repeats).items():
                ratio = phases["total"] / (counted * product)
                row = {"method": method, "p": p, "bound": variant, "counted": counted,
                       "ratio": ratio, "ms": {k: v * 1e3 for k, v in phases.items()}}
                report["runs"].append(row)
                shares = ", ".join(f"{k} {v / phases['total']:.0%}"
                                   for k, v in phases.items() if k != "total")
                print(f"{method:15s} p={p} bound={variant:10s} counted={counted:5.1f} "
                      f"time={phases['total'] * 1e3:7.1f} ms ratio={ratio:.2f} | {shares}")
    if args.evd:
        report["evd"] = _evd_ratios(args.batch, args.n, args.p[0], args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
