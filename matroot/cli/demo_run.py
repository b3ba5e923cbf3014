"""The demo: every method on every backend, on Shampoo-like factors, against eigh.

Built from the parts it shares with the benchmarks: the problem is
:func:`~matroot.testing.shampoo_factors` (fixed seed, no downloads), the
oracle :class:`matroot.testing.SPDCase` (float64 eigh of the same
rounded input), the contenders and their numbers
:mod:`~matroot.cli.contenders` (the eigh baseline a user would write without
matroot, and every method through ``inv_root_info``), and the timing
:func:`~matroot.cli.timing.interleaved_times` (warm-up, then round-robin
repeats, so a burst of machine noise hits every contender alike).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Hashable

import numpy as np

import matroot
from matroot.testing import SPDCase, shampoo_factors
from matroot.testing.backends import Target
from matroot.testing.seeded import ENERGY_RANGE, GRADIENT_RANKS, SHAMPOO_STEPS

from .contenders import all_methods, contender, summarise
from .threads import describe_threads
from .timing import interleaved_times, timed_call

__all__ = ["run_demo", "format_table", "write_plot", "write_json", "ACCURATE"]

#: A result with a larger worst-case relative error is not called accurate.
ACCURATE = 1e-3
#: Seconds of repeats each contender gets; a warm-up longer than this is its one
#: sample. (Not shorter: minimax designs its coefficients in its first call, which
#: takes most of a second on a CPU.)
BUDGET_S = 1.0
BASELINE = "eigh (baseline)"


def _row(target: Target, method: str, **fields) -> dict:
    row = dict(backend=target.backend, device=target.device, method=method, time_s=None,
               speedup_vs_eigh=None, rel_err_median=None, rel_err_max=None,
               iterations_min=None, iterations_max=None, matmuls_median=None,
               converged=None, total=None, note="")
    row.update(fields)
    return row


def run_target(target: Target, factors, oracle, *, p, eps, methods, repeats,
               progress=None) -> list[dict]:
    """Time and check the eigh baseline and every method on one target."""
    a = target.asarray(factors)
    contenders = {BASELINE: contender(a, "eigh_batched", p, eps=eps)}
    contenders.update({m: contender(a, m, p, eps=eps) for m in methods})
    warm: dict[Hashable, tuple[Callable, float]] = {}
    rows: dict[Hashable, dict] = {}
    for name, fn in contenders.items():
        if progress is not None:
            progress.step(f"{target.label}: {name}")
        try:
            first, result = timed_call(fn, target.synchronize)
        except (ValueError, TypeError) as err:  # the method rejects this p or dtype
            rows[name] = _row(target, name, note=f"skipped: {err}")
            continue
        except Exception as err:  # a solver bug: report it and go on with the others
            rows[name] = _row(target, name, note=f"failed with {type(err).__name__}: "
                                                 f"{str(err).splitlines()[0]}")
            continue
        numbers = summarise(target, result, oracle)
        warm[name] = (fn, first)
        matmuls = target.to_host(result.matmuls) if name != BASELINE else None
        rows[name] = _row(
            target, name, rel_err_median=numbers["err_median"],
            rel_err_max=numbers["err_max"],
            iterations_min=None if name == BASELINE else numbers["iterations_min"],
            iterations_max=None if name == BASELINE else numbers["iterations"],
            matmuls_median=None if matmuls is None else float(np.median(matmuls)),
            converged=None if name == BASELINE else numbers["converged_count"],
            total=factors.shape[0])
    times = interleaved_times(warm, target.synchronize, repeats=repeats, budget_s=BUDGET_S,
                              reuse_first_above_s=BUDGET_S)
    for key, samples in times.items():
        rows[key]["time_s"] = statistics.median(samples)
    base = rows[BASELINE]["time_s"]
    for row in rows.values():
        if row["time_s"] is not None and base is not None:
            row["speedup_vs_eigh"] = base / row["time_s"]
    return list(rows.values())


def run_demo(targets, *, methods=None, p=4.0, batch=16, size=128, eps=1e-5,
             dtype="float32", repeats=3, seed=0, progress=None) -> dict:
    """Build the problem, run every method on every target, return a JSON-able report.

    ``progress`` (a :class:`~matroot.cli.progress.Progress` or None) counts the
    contenders' warm-up calls, ``len(targets) * (len(methods) + 1)`` of them.
    """
    methods = all_methods() if methods is None else list(methods)
    factors = shampoo_factors(batch, size, seed=seed).astype(dtype)
    oracle = SPDCase(factors, eps, "shampoo_factors")
    exact = oracle.inv_root(p)
    start = time.perf_counter()
    rows = []
    for target in targets:
        rows += run_target(target, factors, exact, p=p, eps=eps, methods=methods,
                           repeats=repeats, progress=progress)
    p_out = int(p) if float(p).is_integer() else p
    return {
        "problem": {
            "description": "Shampoo factors sum_t G_t G_t^T of random low-rank "
                           "gradients, with one absolute ridge eps",
            "batch": batch, "n": size, "p": p_out, "eps": eps, "dtype": dtype,
            "steps": SHAMPOO_STEPS, "gradient_ranks": list(GRADIENT_RANKS),
            "energy_range": list(ENERGY_RANGE), "seed": seed,
            "kappa_min": float(oracle.kappa.min()),
            "kappa_max": float(oracle.kappa.max()),
        },
        "timing": f"median of up to {repeats} interleaved calls after a warm-up call "
                  f"(the warm-up alone when it takes over {BUDGET_S:g} s)",
        "matroot_version": matroot.__version__,
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }


def _sci(value) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "nan"
    return f"{value:.1e}"


def _iterations(row: dict) -> str:
    lo, hi = row["iterations_min"], row["iterations_max"]
    if lo is None:
        return "-"
    return str(lo) if lo == hi else f"{lo}-{hi}"


def format_table(report: dict) -> str:
    """The report as a fixed-width text table with a header and footnotes."""
    prob = report["problem"]
    lines = [
        f"{prob['batch']} Shampoo factors of size {prob['n']}x{prob['n']} "
        f"({prob['dtype']}), (L + {prob['eps']:g} I)^(-1/{prob['p']}), "
        f"condition numbers {prob['kappa_min']:.2g} to {prob['kappa_max']:.2g}",
    ]
    if "threads" in report:
        lines.append(describe_threads(report["threads"]))
    lines.append("")
    header = ("backend", "method", "time ms", "vs eigh", "err med", "err max",
              "iters", "matmuls", "converged")
    body: list[tuple[str, ...]] = []
    for row in report["rows"]:
        if row["time_s"] is None:
            note = row["note"] if len(row["note"]) <= 100 else row["note"][:99] + "…"
            body.append((_target_label(row), row["method"], note))
            continue
        conv = "-" if row["converged"] is None else f"{row['converged']}/{row['total']}"
        matmuls = "-" if row["matmuls_median"] is None else f"{row['matmuls_median']:g}"
        body.append((_target_label(row), row["method"], f"{row['time_s'] * 1e3:.1f}",
                     f"{row['speedup_vs_eigh']:.2f}x", _sci(row["rel_err_median"]),
                     _sci(row["rel_err_max"]), _iterations(row), matmuls, conv))
    full = [r for r in body if len(r) == len(header)]
    widths = [max([len(header[i])] + [len(r[i]) for r in full]) for i in range(len(header))]
    right = {2, 3, 4, 5, 6, 7, 8}

    def fmt(cells):
        if len(cells) == 3:
            return f"{cells[0]:<{widths[0]}}  {cells[1]:<{widths[1]}}  {cells[2]}"
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    lines.append(fmt(header))
    lines.append("  ".join("-" * w for w in widths))
    previous = None
    for cells in body:
        if previous is not None and cells[0] != previous:
            lines.append("")
        previous = cells[0]
        lines.append(fmt(cells))
    lines += [
        "",
        f"time: {report['timing']}; vs eigh: time of the batched-eigh baseline on the "
        "same backend / time of the method (> 1 is faster).",
        "err: relative Frobenius error against a float64 eigh oracle (median, worst "
        "matrix). iters: per-matrix steps (chebyshev: polynomial degree).",
    ]
    lines += _verdicts(report)
    return "\n".join(lines)


def _target_label(row: dict) -> str:
    return Target(row["backend"], row["device"]).label


def _verdicts(report: dict) -> list[str]:
    """One line per target: the fastest method whose worst error is below ACCURATE."""
    lines = []
    labels = list(dict.fromkeys(_target_label(r) for r in report["rows"]))
    for label in labels:
        rows = [r for r in report["rows"] if _target_label(r) == label
                and r["time_s"] is not None and r["method"] != BASELINE]
        accurate = [r for r in rows if r["rel_err_max"] is not None
                    and math.isfinite(r["rel_err_max"]) and r["rel_err_max"] <= ACCURATE
                    and r["converged"] == r["total"]]
        if not accurate:
            lines.append(f"{label}: no method reached a worst-case error of {ACCURATE:g}")
            continue
        best = min(accurate, key=lambda r: r["time_s"])
        lines.append(f"{label}: fastest with worst error <= {ACCURATE:g}: {best['method']} "
                     f"({best['time_s'] * 1e3:.1f} ms, {best['speedup_vs_eigh']:.2f}x eigh)")
    return lines


def write_plot(report: dict, path) -> None:
    """Two panels: time per method and worst-case error, one bar per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["time_s"] is not None]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    labels = list(dict.fromkeys(_target_label(r) for r in rows))
    lookup = {(_target_label(r), r["method"]): r for r in rows}
    width = 0.8 / max(1, len(labels))
    x = np.arange(len(methods))
    fig, (ax_time, ax_err) = plt.subplots(1, 2, figsize=(12, 4.6))
    for k, label in enumerate(labels):
        offsets = x - 0.4 + width * (k + 0.5)
        times = [lookup[(label, m)]["time_s"] * 1e3 if (label, m) in lookup else np.nan
                 for m in methods]
        errors = [lookup[(label, m)]["rel_err_max"] if (label, m) in lookup else np.nan
                  for m in methods]
        ax_time.bar(offsets, times, width, label=label)
        ax_err.bar(offsets, [e if e is not None else np.nan for e in errors], width,
                   label=label)
    prob = report["problem"]
    ax_time.set_ylabel("time per stack (ms, log scale)")
    ax_err.set_ylabel("worst relative error vs float64 eigh (log scale)")
    ax_err.axhline(ACCURATE, color="grey", linestyle="--", linewidth=1,
                   label=f"{ACCURATE:g}")
    for ax in (ax_time, ax_err):
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels(methods, rotation=20, ha="right")
        ax.grid(axis="y", alpha=0.3)
    ax_time.legend(fontsize="small")
    fig.suptitle(
        f"matroot demo: {prob['batch']} Shampoo factors {prob['n']}x{prob['n']} "
        f"{prob['dtype']}, p={prob['p']}, eps={prob['eps']:g}, "
        f"κ {prob['kappa_min']:.2g} to {prob['kappa_max']:.2g}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(report: dict, path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2, allow_nan=True)
        fh.write("\n")
