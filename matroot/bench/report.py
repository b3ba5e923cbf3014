"""Markdown tables of a solver benchmark's JSON: ``python -m matroot.bench.report RESULTS.json``.

Writes ``summary.md`` next to the JSON (or to ``--out``): the ratios the
benchmark measured, never an absolute time on its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["summary_markdown", "fastest_methods", "main"]


def _fmt(value, digits=2):
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 100 or abs(value) < 0.01:
        return f"{value:.1e}"
    return f"{value:.{digits}g}" if abs(value) < 10 else f"{value:.0f}"


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fastest_methods(doc) -> list:
    """Per (backend, n, batch, p): the fastest matroot method at the default tolerance.

    Methods whose error missed the accuracy of batched eigh by more than 100×
    and 1e-3 (chebyshev without a good λmin bound) are not eligible.

    Examples
    --------
    >>> from matroot.bench.report import fastest_methods
    >>> row = dict(backend="numpy", n=8, batch=1, p=2, kind="matroot", time_s=1.0,
    ...            err_max=1e-6)
    >>> fastest_methods({"sweep": [dict(row, method="evd"),
    ...                            dict(row, method="newton_db", time_s=0.5)]})[0]["method"]
    'newton_db'
    """
    groups = {}
    for r in doc.get("sweep", []):
        groups.setdefault((r["backend"], r["n"], r["batch"], r["p"]), []).append(r)
    out = []
    for (backend, n, batch, p), rows in sorted(groups.items()):
        eligible = [r for r in rows if r["kind"] == "matroot" and r["err_max"] is not None
                    and r["err_max"] <= 1e-3]
        if not eligible:
            continue
        best = min(eligible, key=lambda r: r["time_s"])
        runner_up = min((r for r in eligible if r is not best), key=lambda r: r["time_s"],
                        default=None)
        out.append(dict(backend=backend, n=n, batch=batch, p=p, method=best["method"],
                        margin=(runner_up["time_s"] / best["time_s"]) if runner_up else None,
                        runner_up=runner_up["method"] if runner_up else None))
    return out


def _sweep_section(doc):
    rows = doc.get("sweep", [])
    if not rows:
        return []
    methods = list(dict.fromkeys(r["method"] for r in rows if r["kind"] == "matroot"))
    parts = ["## Default tolerance: time ÷ batched eigh (lower is better)", "",
             f"κ = {doc['config']['kappa']:g}, {doc['config']['dtype']}. "
             "Each cell is the median time of the method divided by the median time "
             "of batched eigh (root formed from it) measured in the same interleaved "
             "rounds; `eigh = k mm` is batched eigh's time in batched matmuls of that "
             "size; `eff.` is the fastest matmul method's time ÷ (its matmuls × one "
             "matmul's time), 1 being the matmul floor.", ""]
    header = (["backend", "p", "n", "b"] + methods + ["eigh_loop", "eigh = k mm",
                                                      "best matmul method", "eff."])
    table = []
    for summary in doc["sweep_summary"]:
        here = {r["method"]: r for r in rows
                if (r["backend"], r["n"], r["batch"], r["p"]) ==
                (summary["backend"], summary["n"], summary["batch"], summary["p"])}
        cells = [summary["backend"], summary["p"], summary["n"], summary["batch"]]
        cells += [_fmt(here[m]["ratio_to_eigh_batched"]) if m in here else "skipped"
                  for m in methods]
        cells.append(_fmt(here["eigh_loop"]["ratio_to_eigh_batched"])
                     if "eigh_loop" in here else "skipped")
        cells += [_fmt(summary["eigh_in_matmuls"]), summary["fastest_matmul_method"] or "—",
                  _fmt(summary["fastest_matmul_method_efficiency"])]
        table.append(cells)
    table.sort(key=lambda c: (c[0], c[1], c[2], c[3]))
    parts += [_table(header, table), ""]
    parts += ["## Errors at the default tolerance (max relative error vs float64 eigh)", ""]
    header = ["backend", "p", "n", "b"] + methods + ["eigh_batched"]
    table = []
    for summary in doc["sweep_summary"]:
        here = {r["method"]: r for r in rows
                if (r["backend"], r["n"], r["batch"], r["p"]) ==
                (summary["backend"], summary["n"], summary["batch"], summary["p"])}
        table.append([summary["backend"], summary["p"], summary["n"], summary["batch"]]
                     + [_fmt(here[m]["err_max"]) if m in here else "skipped"
                        for m in methods + ["eigh_batched"]])
    table.sort(key=lambda c: (c[0], c[1], c[2], c[3]))
    parts += [_table(header, table), ""]
    fastest = fastest_methods(doc)
    if fastest:
        parts += ["## Fastest matroot method (error ≤ 1e-3) per configuration", "",
                  _table(["backend", "p", "n", "b", "fastest", "runner-up", "margin"],
                         [[f["backend"], f["p"], f["n"], f["batch"], f["method"],
                           f["runner_up"] or "—", _fmt(f["margin"])] for f in fastest]), ""]
    return parts


def _tta_section(doc):
    rows = doc.get("time_to_accuracy_summary", [])
    if not rows:
        return []
    first = rows[0]
    parts = ["## Time to accuracy", "",
             f"{first['backend']}, n = {first['n']}, b = {first['batch']}: the fewest "
             "matmuls and the least time (÷ batched eigh's time) at which each method's "
             "worst matrix reached the target error, sweeping the step count "
             "(degree for chebyshev); `default` is the error at the default tolerance.",
             ""]
    table = []
    for r in sorted(rows, key=lambda r: (r["p"], r["kappa"], r["method"])):
        table.append([r["p"], f"{r['kappa']:g}", f"{r['target_error']:g}", r["method"],
                      r["min_matmuls"] if r["reached"] and r["min_matmuls"] else
                      ("—" if r["reached"] else "not reached"),
                      _fmt(r["time_ratio_to_eigh_batched"]) if r["reached"] else "—",
                      _fmt(r["default_err_max"])])
    parts += [_table(["p", "κ", "target", "method", "matmuls", "time ÷ eigh",
                      "default error"], table), ""]
    return parts


def _scaling_section(doc):
    rows = doc.get("scaling", [])
    if not rows:
        return []
    parts = ["## Iterations: power-iteration vs Frobenius scaling", "",
             "Iterations at the default tolerance (worst matrix), `power / frobenius`.", ""]
    kappas = sorted({r["kappa"] for r in rows})
    keys = list(dict.fromkeys((r.get("spectrum", "geometric"), r["p"], r["method"])
                              for r in rows))
    table = []
    for spectrum, p, method in keys:
        here = {(r["kappa"], r["scaling"]): r for r in rows
                if (r.get("spectrum", "geometric"), r["p"], r["method"]) ==
                (spectrum, p, method)}
        ratio = max(r["frobenius_over_lambda_max"] for r in here.values())
        table.append([spectrum, f"{ratio:.1f}", p, method] + [
            f"{here[(k, 'power')]['iterations']} / {here[(k, 'frobenius')]['iterations']}"
            if (k, "power") in here and (k, "frobenius") in here else "—" for k in kappas])
    parts += [_table(["spectrum", "‖A‖_F/λmax", "p", "method"]
                     + [f"κ={k:g}" for k in kappas], table), ""]
    return parts


def summary_markdown(doc) -> str:
    """The benchmark's ratios as Markdown tables.

    Examples
    --------
    >>> from matroot.bench.report import summary_markdown
    >>> summary_markdown({"schema": "matroot.bench.solvers/1", "config": {},
    ...                   "backends": []}).splitlines()[0]
    '# matroot solver benchmark: summary'
    """
    machine = doc.get("machine", {})
    parts = ["# matroot solver benchmark: summary", "",
             "Generated by `python -m matroot.bench.report` from `solvers.json`.", ""]
    if machine:
        parts += [f"Machine: {machine.get('processor')}, {machine.get('cpu_count')} "
                  f"logical CPUs; backends {', '.join(doc['backends'])}; worker "
                  f"environment {machine.get('worker_environment')}; run took "
                  f"{doc.get('elapsed_s', 0):.0f} s.", ""]
    parts += _sweep_section(doc) + _tta_section(doc) + _scaling_section(doc)
    skipped = doc.get("skipped", [])
    if skipped:
        parts += ["## Skipped", ""]
        parts += [f"- {s['backend']} n={s['n']} b={s['batch']} p={s['p']} {s['method']}: "
                  f"{s['reason']}" for s in skipped]
        parts.append("")
    return "\n".join(parts)


def main(argv=None) -> int:
    """``python -m matroot.bench.report RESULTS.json [--out DIR]``; returns the exit status.

    Examples
    --------
    From a shell::

        python -m matroot.bench.report bench/results/solvers.json
    """
    parser = argparse.ArgumentParser(prog="python -m matroot.bench.report",
                                     description="Write summary.md from a solver "
                                                 "benchmark's JSON results.")
    parser.add_argument("results", help="the solvers.json a benchmark run wrote")
    parser.add_argument("--out", help="output folder (default: the JSON's folder)")
    args = parser.parse_args(argv)
    path = Path(args.results)
    if not path.is_file():
        parser.error(f"no such results file: {path}")
    out = Path(args.out or path.parent) / "summary.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(summary_markdown(json.loads(path.read_text())))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
