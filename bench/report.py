"""Tables of a solver benchmark's JSON: ``python -m bench report RESULTS.json``.

Writes ``summary.md`` and ``summary.rst`` (for ``.. include::`` in the docs) next
to the JSON, or to ``--out``: the ratios the benchmark measured, never an
absolute time on its own.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["summary_markdown", "summary_rst", "write_summaries", "fastest_methods", "render"]


def _fmt(value, digits=2):
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 100 or abs(value) < 0.01:
        return f"{value:.1e}"
    return f"{value:.{digits}g}" if abs(value) < 10 else f"{value:.0f}"


def _table(header, rows):
    return ("table", [str(h) for h in header], [[str(c) for c in row] for row in rows])


def _heading(text):
    return ("heading", text)


def _para(text):
    return ("para", text)


def _bullets(items):
    return ("bullets", list(items))


def render(blocks, fmt: str) -> str:
    """Render report blocks as Markdown (``"md"``) or reStructuredText (``"rst"``).

    Headings become level-2 Markdown headings or ``-``-underlined RST sections
    (so the RST can be included under a page's ``=`` title); inline code is
    written with single backticks and doubled for RST.
    """
    out = []
    for block in blocks:
        kind = block[0]
        if kind == "heading":
            text = block[1]
            out += [f"## {text}" if fmt == "md" else f"{text}\n{'-' * len(text)}", ""]
        elif kind == "para":
            text = block[1] if fmt == "md" else _rst_inline(block[1])
            out += [text, ""]
        elif kind == "bullets":
            out += [f"- {_rst_inline(item) if fmt == 'rst' else item}" for item in block[1]]
            out.append("")
        elif fmt == "md":
            _, header, rows = block
            out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            out += ["| " + " | ".join(row) + " |" for row in rows]
            out.append("")
        else:
            _, header, rows = block
            out += [".. csv-table::",
                    "   :header: " + ", ".join(_csv_cell(h) for h in header), ""]
            out += ["   " + ", ".join(_csv_cell(c) for c in row) for row in rows]
            out.append("")
    return "\n".join(out)


def _rst_inline(text):
    return text.replace("`", "``")


def _csv_cell(text):
    return '"' + text.replace('"', '""') + '"'


def fastest_methods(doc) -> list:
    """Per (backend, n, batch, p): the fastest matroot method at the default tolerance.

    Methods whose worst error exceeds 1e-3 (chebyshev without a good λmin
    bound, for one) are not eligible. ``margin`` is the runner-up's time ÷ the
    winner's.

    Examples
    --------
    >>> from bench.report import fastest_methods
    >>> row = dict(backend="numpy", n=8, batch=1, p=2, kind="matroot", time_s=1.0,
    ...            err_max=1e-6)
    >>> fastest_methods({"sweep": [dict(row, method="evd"),
    ...                            dict(row, method="newton_db", time_s=0.5)]})[0]["method"]
    'newton_db'
    """
    groups: dict[tuple, list] = {}
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
    parts = [_heading("Default tolerance: time ÷ batched eigh (lower is better)"),
             _para(f"κ = {doc['config']['kappa']:g}, {doc['config']['dtype']}. "
                   "Each cell is the median time of the method divided by the median "
                   "time of batched eigh (root formed from it) measured in the same "
                   "interleaved rounds; `eigh = k mm` is batched eigh's time in batched "
                   "matmuls of that size; `eff.` is the fastest matmul method's time ÷ "
                   "(its matmuls × one matmul's time), 1 being the matmul floor.")]
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
    parts += [_table(header, table),
              _heading("Errors at the default tolerance (max relative error vs float64 "
                       "eigh)")]
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
    parts.append(_table(header, table))
    fastest = fastest_methods(doc)
    if fastest:
        parts += [_heading("Fastest matroot method (error ≤ 1e-3) per configuration"),
                  _table(["backend", "p", "n", "b", "fastest", "runner-up", "margin"],
                         [[f["backend"], f["p"], f["n"], f["batch"], f["method"],
                           f["runner_up"] or "—", _fmt(f["margin"])] for f in fastest])]
    return parts


def _tta_section(doc):
    rows = doc.get("time_to_accuracy_summary", [])
    if not rows:
        return []
    first = rows[0]
    parts = [_heading("Time to accuracy"),
             _para(f"{first['backend']}, n = {first['n']}, b = {first['batch']}: the "
                   "fewest matmuls and the least time (÷ batched eigh's time) at which "
                   "each method's worst matrix reached the target error, sweeping the "
                   "step count (degree for chebyshev); `default error` is the worst "
                   "error at the default tolerance.")]
    table = []
    for r in sorted(rows, key=lambda r: (r["p"], r["kappa"], r["method"])):
        table.append([r["p"], f"{r['kappa']:g}", f"{r['target_error']:g}", r["method"],
                      r["min_matmuls"] if r["reached"] and r["min_matmuls"] else
                      ("—" if r["reached"] else "not reached"),
                      _fmt(r["time_ratio_to_eigh_batched"]) if r["reached"] else "—",
                      _fmt(r["default_err_max"])])
    parts.append(_table(["p", "κ", "target", "method", "matmuls", "time ÷ eigh",
                         "default error"], table))
    return parts


def _scaling_section(doc):
    rows = doc.get("scaling", [])
    if not rows:
        return []
    parts = [_heading("Iterations: power-iteration vs Frobenius scaling"),
             _para("Iterations at the default tolerance (worst matrix), "
                   "`power / frobenius`.")]
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
    parts.append(_table(["spectrum", "‖A‖_F/λmax", "p", "method"]
                        + [f"κ={k:g}" for k in kappas], table))
    return parts


def summary_blocks(doc) -> list:
    """The report's blocks (headings, paragraphs, tables) for :func:`render`."""
    machine = doc.get("machine", {})
    blocks = []
    if machine:
        blocks.append(_para(
            f"Machine: {machine.get('processor')}, {machine.get('cpu_count')} logical "
            f"CPUs; backends {', '.join(doc['backends'])}; worker environment "
            f"{machine.get('worker_environment')}; the run took "
            f"{doc.get('elapsed_s', 0):.0f} s."))
    blocks += _sweep_section(doc) + _tta_section(doc) + _scaling_section(doc)
    skipped = doc.get("skipped", [])
    if skipped:
        blocks += [_heading("Skipped"), _bullets(
            f"{s['backend']} n={s['n']} b={s['batch']} p={s['p']} {s['method']}: "
            f"{s['reason']}" for s in skipped)]
    return blocks


def summary_markdown(doc) -> str:
    """The benchmark's ratios as Markdown tables.

    Examples
    --------
    >>> from bench.report import summary_markdown
    >>> summary_markdown({"schema": "matroot.bench.solvers/1", "config": {},
    ...                   "backends": []}).splitlines()[0]
    '# matroot solver benchmark: summary'
    """
    head = "# matroot solver benchmark: summary\n\nGenerated by " \
           "`python -m bench report` from `solvers.json`.\n\n"
    return head + render(summary_blocks(doc), "md")


def summary_rst(doc) -> str:
    """The same tables as reStructuredText sections, for ``.. include::`` in the docs."""
    head = (".. Generated by python -m bench report from solvers.json; "
            "do not edit.\n\n")
    return head + render(summary_blocks(doc), "rst")


def write_summaries(doc, out_dir) -> list:
    """Write ``summary.md`` and ``summary.rst`` into ``out_dir``; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "summary.md", out_dir / "summary.rst"]
    paths[0].write_text(summary_markdown(doc))
    paths[1].write_text(summary_rst(doc))
    return paths
