"""The sweep experiment: every contender over sizes, batches and p, next to one batched matmul.

For each (n, batch, p): time (median of interleaved repeats after a warm-up),
matmul count, error against the float64 oracle, residual and iterations of
every method at its default tolerance, the two eigh baselines, and the time of
one batched matmul of that size measured in the same rounds. Derived: each
method's time in matmul equivalents, its *efficiency* (time ÷ time of the same
number of batched matmuls) and its time ratio to both baselines.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from matroot.cli.contenders import BASELINES, contender, summarise
from matroot.cli.timing import interleaved_times, timed_call

from .config import baselines_for, methods_for
from .prepared import load_problem

__all__ = ["sweep", "sweep_summary", "format_ratio", "matmul_block"]


def sweep(config, backend, problems, progress, skipped):
    records = []
    predict = {}  # (method, p) -> (first-call seconds, matmul seconds) last seen
    for entry in problems:
        host, exact = load_problem(entry, config.ps)
        found = _sweep_config(config, backend, host, exact, entry["n"], entry["batch"],
                              predict, progress, skipped)
        records += [dict(r, seed=entry["seed"]) for r in found]
    return records


def _sweep_config(config, backend, host, exact, n, batch, predict, progress, skipped):
    a = backend.asarray(host)
    block, k, _ = matmul_block(a, config.matmul_block_s, backend.synchronize)
    t_block, _ = timed_call(block, backend.synchronize)
    mm_first = t_block / k
    label = f"{backend.name} n={n} b={batch}"
    entries = {}
    for p in config.ps:
        for method in methods_for(config, p) + baselines_for(config):
            seen = predict.get((method, p))
            if seen is not None:
                # The last size's first call, scaled by how much slower a matmul got.
                expected = seen[0] * mm_first / seen[1]
                if expected > config.max_call_s:
                    skipped.append(dict(experiment="sweep", backend=backend.name, n=n,
                                        batch=batch, p=p, method=method,
                                        predicted_s=expected,
                                        reason=f"predicted {expected:.1f} s per call "
                                               f"> max_call_s={config.max_call_s} s"))
                    progress.step(f"{label} p={p} {method}: skipped "
                                  f"(predicted {expected:.1f} s per call)")
                    continue
            fn = contender(a, method, p)
            first, result = timed_call(fn, backend.synchronize)
            numbers = summarise(backend, result, exact[p])
            del result
            predict[(method, p)] = (first, mm_first)
            entries[(method, p)] = (fn, first, numbers)
            progress.step(f"{label} p={p} {method}: first call {first:.3g} s, "
                          f"err {format_ratio(numbers['err_max'])}, {numbers['matmuls']} matmuls")
    calls = {key: (fn, first) for key, (fn, first, _) in entries.items()}
    calls["matmul"] = (block, t_block)
    times = interleaved_times(calls, backend.synchronize, repeats=config.repeats,
                              budget_s=config.entry_budget_s,
                              reuse_first_above_s=config.reuse_first_above_s)
    t_mm = statistics.median(times.pop("matmul")) / k
    records = []
    for (method, p), (_, first, numbers) in entries.items():
        samples = times[(method, p)]
        median = statistics.median(samples)
        records.append(dict(
            backend=backend.name, device=backend.device, n=n, batch=batch, p=p,
            kappa=config.kappa, dtype=config.dtype, method=method,
            kind="baseline" if method in BASELINES else "matroot",
            time_s=median, times_s=samples, first_call_s=first,
            matmul_time_s=t_mm, matmul_block=k,
            matmul_equivalents=median / t_mm,
            efficiency=(median / (numbers["matmuls"] * t_mm)
                        if numbers["matmuls"] else None),
            **numbers))
    for record in records:
        for baseline in BASELINES:
            ref = next((r for r in records if r["method"] == baseline
                        and r["p"] == record["p"]), None)
            record[f"ratio_to_{baseline}"] = (record["time_s"] / ref["time_s"]
                                              if ref else None)
    return records




def sweep_summary(records):
    """Per (backend, n, batch, p): the fastest contender and the headline ratios."""
    groups = {}
    for r in records:
        groups.setdefault((r["backend"], r["n"], r["batch"], r["p"]), []).append(r)
    rows = []
    for (backend, n, batch, p), group in groups.items():
        by_method = {r["method"]: r for r in group}
        ours = [r for r in group if r["kind"] == "matroot"]
        matmul_only = [r for r in ours if r["matmuls"] > 0]
        fastest = min(group, key=lambda r: r["time_s"])
        best_ours = min(ours, key=lambda r: r["time_s"]) if ours else None
        best_mm = min(matmul_only, key=lambda r: r["time_s"]) if matmul_only else None
        batched = by_method.get("eigh_batched")
        loop = by_method.get("eigh_loop")
        rows.append(dict(
            backend=backend, n=n, batch=batch, p=p,
            fastest=fastest["method"],
            fastest_matroot=best_ours["method"] if best_ours else None,
            fastest_matmul_method=best_mm["method"] if best_mm else None,
            fastest_matmul_method_vs_eigh_batched=_ratio(best_mm, batched),
            fastest_matmul_method_vs_eigh_loop=_ratio(best_mm, loop),
            evd_vs_eigh_batched=_ratio(by_method.get("evd"), batched),
            eigh_loop_vs_eigh_batched=_ratio(loop, batched),
            eigh_in_matmuls=batched["matmul_equivalents"] if batched else None,
            fastest_matmul_method_efficiency=best_mm["efficiency"] if best_mm else None,
        ))
    return rows


def _ratio(num, den):
    if num is None or den is None:
        return None
    return num["time_s"] / den["time_s"]


def format_ratio(value):
    return "n/a" if value is None else f"{value:.2g}"


def matmul_block(a, seconds: float, synchronize: Callable):
    """A callable that forms ``k`` batched products ``a @ a``, and ``k``.

    ``k`` is chosen so that one call lasts about ``seconds``, which keeps the
    per-matmul time above the timer's and the launch's resolution.

    Returns
    -------
    (callable, int, float)
        The block, its matmul count, and the warm-up estimate of one matmul.
    """
    single = statistics.median(timed_call(lambda: a @ a, synchronize)[0] for _ in range(3))
    k = max(1, min(1000, math.ceil(seconds / max(single, 1e-9))))

    def block():
        out = None
        for _ in range(k):
            out = a @ a
        return out

    return block, k, single
