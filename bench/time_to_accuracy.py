"""The time-to-accuracy experiment: error against time and matmuls as the step count grows.

Every method at κ ∈ ``Config.tta_kappas``, at its default tolerance and along
a grid of fixed step counts (``tol=0, max_iter=k``; the degree for chebyshev),
next to the eigh baselines.
"""

from __future__ import annotations

import math
import statistics

from matroot.cli.contenders import BASELINES, contender, summarise
from matroot.cli.timing import interleaved_times, timed_call

from .config import DEGREE_GRID, ITERATION_GRID, TARGET_ERROR, baselines_for, methods_for
from .prepared import load_problem

__all__ = ["time_to_accuracy", "tta_summary"]


def _grid(method):
    if method == "evd":
        return ()
    if method == "chebyshev":
        return DEGREE_GRID
    return ITERATION_GRID


def time_to_accuracy(config, backend, problems, progress):
    curves = []
    for entry in problems:
        host, exact_by_p = load_problem(entry, config.ps)
        a = backend.asarray(host)
        kappa = entry["kappa"]
        for p in config.ps:
            exact = exact_by_p[p]
            points = {}
            for method in methods_for(config, p):
                found = _tta_error_pass(backend, a, method, p, exact)
                points.update(found)
                progress.step(f"time-to-accuracy {backend.name} κ={kappa:g} p={p} "
                              f"{method}: {len(found)} settings")
            for method in baselines_for(config):
                fn = contender(a, method, p)
                first, result = timed_call(fn, backend.synchronize)
                points[(method, "default")] = (fn, first,
                                               summarise(backend, result, exact))
            times = interleaved_times({key: (fn, first) for key, (fn, first, _)
                                       in points.items()}, backend.synchronize,
                                      repeats=config.tta_repeats,
                                      budget_s=config.tta_budget_s,
                                      reuse_first_above_s=config.reuse_first_above_s)
            for method in dict.fromkeys(key[0] for key in points):
                curve = [dict(setting=setting, default=setting == "default",
                              time_s=statistics.median(times[(m, setting)]),
                              times_s=times[(m, setting)], **numbers)
                         for (m, setting), (_, _, numbers) in points.items() if m == method]
                curves.append(dict(backend=backend.name, device=backend.device,
                                   n=entry["n"], batch=entry["batch"], p=p, kappa=kappa,
                                   seed=entry["seed"], dtype=config.dtype, method=method,
                                   kind="baseline" if method in BASELINES else "matroot",
                                   points=curve))
    return curves


def _tta_error_pass(backend, a, method, p, exact):
    """Run ``method`` at its default and along its grid until the error stops falling.

    The runs double as the warm-up calls. Returns ``(method, setting) ->
    (fn, first_seconds, numbers)``; the setting is "default" or the step count
    (``tol=0, max_iter=k``: exactly k steps, or degree k for chebyshev).
    """
    out = {}
    fn = contender(a, method, p)
    first, result = timed_call(fn, backend.synchronize)
    out[(method, "default")] = (fn, first, summarise(backend, result, exact))
    best = math.inf
    stalled = failed = 0
    for steps in _grid(method):
        fn = contender(a, method, p, tol=0.0, max_iter=steps)
        first, result = timed_call(fn, backend.synchronize)
        numbers = summarise(backend, result, exact)
        out[(method, steps)] = (fn, first, numbers)
        err = numbers["err_max"]
        if err is None:
            failed += 1
            if failed >= 2:
                break
            continue
        failed = 0
        # Past convergence the error only wanders at rounding level: once it has
        # been below 5e-2, stop after two steps of less than 20% improvement.
        # (Before that it can rise for a step: newton_db's second square root
        # starts from the first one's unconverged iterate.)
        stalled = stalled + 1 if (best < 5e-2 and err > 0.8 * best) else 0
        best = min(best, err)
        if stalled >= 2:
            break
    return out


def tta_summary(curves):
    """Least matmuls and least time at which each method meets the κ's target error."""
    rows = []
    for curve in curves:
        target = TARGET_ERROR.get(curve["kappa"])
        if target is None:
            continue
        good = [pt for pt in curve["points"]
                if pt["err_max"] is not None and pt["err_max"] <= target]
        default = next((pt for pt in curve["points"] if pt["default"]), None)
        rows.append(dict(
            backend=curve["backend"], n=curve["n"], batch=curve["batch"], p=curve["p"],
            kappa=curve["kappa"], method=curve["method"], target_error=target,
            reached=bool(good),
            min_matmuls=min((pt["matmuls"] for pt in good), default=None),
            min_time_s=min((pt["time_s"] for pt in good), default=None),
            default_err_max=default["err_max"] if default else None,
            default_matmuls=default["matmuls"] if default else None,
            default_time_s=default["time_s"] if default else None))
    for row in rows:
        # eigh's time is the yardstick whether or not float32 eigh met the target.
        ref = next((r for r in rows if r["method"] == "eigh_batched"
                    and (r["backend"], r["p"], r["kappa"]) ==
                    (row["backend"], row["p"], row["kappa"])), None)
        row["time_ratio_to_eigh_batched"] = (
            row["min_time_s"] / ref["default_time_s"]
            if ref and row["min_time_s"] is not None else None)
    return rows

