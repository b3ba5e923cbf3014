"""Where a solve's time goes beyond its products: measured side by side in one run.

For each method, on one 8×384² float32 torch stack (by default):

- ``ratio``: the solve's time ÷ (its counted product-equivalents × one batched
  product), the quantity issue 21 asks to bring to ≤ 1.25;
- a profile of the call by phase: the Lanczos run, the λmax bound, the solver
  loop, the a-posteriori check, and the rest (validation, casts, scaling, small
  per-call operations). The phases are timed by wrapping the functions
  :mod:`matroot.roots.stack_solve` calls (the wrappers only time; they do not change them);
- with ``--passes``, what the call (the Cholesky bound) does to whole stacks,
  counted rather than timed: products, fresh passes (operators that write a new
  stack), reductions and in-place updates;
- each n×n product of the call (the Cholesky bound) timed where it runs, ÷ the
  same-shaped product repeated alone: what the products themselves cost beyond
  the count (fresh output pages, operands that left the cache);
- the call with each λmax bound, ``bound_certificate="cholesky"`` (a Lanczos
  estimate proven by Cholesky tests) and ``"randomized"`` (the same run's Ritz
  value with Kuczyński and Woźniakowski's margin), interleaved.

With ``--evd``, evd against a plain float32 eigh root (``Q·diag(λ^(-1/p))·Qᵀ``)
on well-conditioned (κ = 10), moderate (κ = 1e2) and κ = 1e4 stacks, interleaved
(each round runs every variant once; the minimum over rounds is kept).

Run ``python -m bench overheads_profile --help``; times are the minimum of
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


def _profiled_once(call, bound: str) -> dict[str, float]:
    """Phase times (seconds) of one inv_root_info call with ``bound_certificate=bound``."""
    import matroot.roots.stack_solve as stack_solve
    from matroot.solvers import registry

    clock = _PhaseClock()
    clock.wrap(stack_solve, "ritz_values", "lanczos")
    clock.wrap(stack_solve, "certified_lambda_max", "lambda_max bound")
    clock.wrap(stack_solve, "randomized_lambda_max", "lambda_max bound")
    clock.wrap(stack_solve, "lambda_min_estimate_core", "lambda_min estimate")
    clock.wrap(stack_solve, "verify_root", "root check")
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
        call(bound)
        total = time.perf_counter() - start
    finally:
        object.__setattr__(spec, "solve", original_solve)
        clock.restore()
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
            phases = _profiled_once(call, variant)
            if round_:
                kept.append(phases)
    return {variant: min(kept, key=lambda phases: phases["total"])
            for variant, kept in runs.items()}


def _products_in_context(call, n: int, repeats: int) -> list[float]:
    """Per n×n product of one call, in call order: its fastest time over
    ``repeats`` calls (seconds). The products are timed by wrapping
    ``torch.Tensor.__matmul__``, ``torch.bmm`` and ``torch.baddbmm`` (the seam
    :mod:`matroot._xp` forms stacked products with; the wrappers only time)."""
    import torch

    originals = {"__matmul__": torch.Tensor.__matmul__, "bmm": torch.bmm,
                 "baddbmm": torch.baddbmm}
    calls: list[list[float]] = []

    def timing(original, operands):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = original(*args, **kwargs)
            left, right = args[operands[0]], args[operands[1]]
            if left.shape[-2:] == (n, n) and right.shape[-2:] == (n, n):
                calls[-1].append(time.perf_counter() - start)
            return out
        return timed

    call()
    torch.Tensor.__matmul__ = timing(originals["__matmul__"], (0, 1))
    torch.bmm = timing(originals["bmm"], (0, 1))
    torch.baddbmm = timing(originals["baddbmm"], (1, 2))
    try:
        for _ in range(repeats):
            calls.append([])
            call()
    finally:
        torch.Tensor.__matmul__ = originals["__matmul__"]
        torch.bmm, torch.baddbmm = originals["bmm"], originals["baddbmm"]
    count = min(len(c) for c in calls)
    return [min(c[i] for c in calls) for i in range(count)]


#: Operators that only view, or change no entry of, a stack: not passes over it.
_VIEWS = {"aten::diagonal", "aten::expand", "aten::view", "aten::reshape", "aten::select",
          "aten::slice", "aten::transpose", "aten::swapaxes", "aten::unsqueeze",
          "aten::broadcast_to", "aten::to", "aten::_to_copy", "aten::alias",
          "aten::as_strided", "aten::detach"}
_REDUCTIONS = {"aten::linalg_vector_norm", "aten::amax", "aten::amin", "aten::sum",
               "aten::max", "aten::min", "aten::any", "aten::all"}


def _stack_passes(call, shape: tuple[int, ...]) -> dict[str, int]:
    """What one call does to whole ``shape`` stacks, counted (not timed) with
    torch's profiler: n×n products, fresh passes (an operator that writes a new
    stack: each costs memory traffic and, where the allocator hands back fresh
    pages, page faults), reductions that only read one, and in-place updates."""
    from torch.profiler import ProfilerActivity, profile

    call()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        call()
    counts = {"products": 0, "fresh passes": 0, "reductions": 0, "in place": 0}
    whole = list(shape)
    for event in prof.events():
        parent = event.cpu_parent
        if not event.name.startswith("aten::") or (
                parent is not None and parent.name.startswith("aten::")):
            continue  # only the operators matroot calls, not their insides
        shapes = [s for s in event.input_shapes if isinstance(s, list)]
        if whole not in shapes or event.name in _VIEWS:
            continue
        if event.name in ("aten::matmul", "aten::bmm", "aten::baddbmm"):
            counts["products"] += all(s[-2:] == whole[-2:] for s in shapes[:2])
        elif event.name.endswith("_"):
            counts["in place"] += 1
        elif event.name in _REDUCTIONS:
            counts["reductions"] += 1
        else:
            counts["fresh passes"] += 1
    return counts


class _Call:
    def __init__(self, x, p, method):
        self.x, self.p, self.method = x, p, method

    def __call__(self, bound="cholesky"):
        import matroot
        return matroot.inv_root_info(self.x, self.p, method=self.method,
                                     bound_certificate=bound)


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--n", type=int, default=384)
    parser.add_argument("--kappa", type=float, default=1e3)
    parser.add_argument("--p", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--methods", nargs="+", default=["newton_db", "coupled_newton", "minimax"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--evd", action="store_true", help="also time evd against a plain "
                        "float32 eigh root")
    parser.add_argument("--passes", action="store_true", help="also count what each "
                        "call does to whole stacks (products, fresh passes, reductions, "
                        "in-place updates) with torch's profiler")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)

    import torch
    from threadpoolctl import threadpool_limits

    from matroot.testing import spd_stack

    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    rng = np.random.default_rng(0)
    a, _, _ = spd_stack(rng, (args.batch,), args.n, args.kappa, spread="uniform")
    x = torch.asarray(a, dtype=torch.float32)
    # The product is timed between the solves too (the best of all): one burst at
    # the start on a shared machine can catch a busy moment and flatter every ratio.
    product = _best_of(lambda: x @ x, 3 * args.repeats)
    runs = []
    for method in args.methods:
        for p in args.p:
            call = _Call(x, p, method)
            for variant, phases in _profile_variants(call, args.repeats).items():
                res = call(variant)
                counted = float((res.matmuls + res.check_matmuls).max())
                runs.append({"method": method, "p": p, "bound": variant, "counted": counted,
                             "ms": {k: v * 1e3 for k, v in phases.items()}})
            runs[-2]["products_ms"] = [t * 1e3 for t in _products_in_context(
                call, args.n, args.repeats)]
            if args.passes:
                runs[-2]["passes"] = _stack_passes(call, tuple(x.shape))
            product = min(product, _best_of(lambda: x @ x, args.repeats))
    print(f"one batched product ({args.batch}×{args.n}², float32, {args.threads} threads): "
          f"{product * 1e3:.2f} ms")
    report: dict = {"product_ms": product * 1e3, "runs": runs}
    for row in runs:
        total = row["ms"]["total"]
        row["ratio"] = total / (row["counted"] * product * 1e3)
        shares = ", ".join(f"{k} {v / total:.0%}" for k, v in row["ms"].items() if k != "total")
        print(f"{row['method']:15s} p={row['p']} bound={row['bound']:10s} "
              f"counted={row['counted']:5.1f} time={total:7.1f} ms ratio={row['ratio']:.2f} "
              f"| {shares}")
        if "products_ms" in row:
            # A product inside the call can take longer than the same product
            # repeated alone (fresh output pages, operands out of cache).
            slowdown = np.array(row["products_ms"]) / (product * 1e3)
            row["product_slowdown"] = {"median": float(np.median(slowdown)),
                                       "max": float(slowdown.max()),
                                       "excess_products": float((slowdown - 1).sum())}
            print(f"{'':15s} its {len(slowdown)} n×n products, each ÷ one product alone: "
                  f"median {np.median(slowdown):.2f}, max {slowdown.max():.2f} "
                  f"({(slowdown - 1).sum():.1f} products of time in all)")
        if "passes" in row:
            print(f"{'':15s} over whole stacks: " + ", ".join(
                f"{count} {kind}" for kind, count in row["passes"].items()))
    if args.evd:
        report["evd"] = _evd_ratios(args.batch, args.n, args.p[0], args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
