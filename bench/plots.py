"""PNG plots of a solver benchmark's JSON: ``python -m bench plots RESULTS.json``.

Every figure is drawn from the JSON that :mod:`bench.solvers` wrote, so
plots can be regenerated (or restyled) without rerunning the benchmark. Times
are shown as ratios to the batched-eigh time measured in the same run.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from .config import TARGET_ERROR

__all__ = ["make_plots"]

_STYLE = {
    "evd": dict(color="tab:gray", marker="s"),
    "newton_db": dict(color="tab:blue", marker="o"),
    "coupled_newton": dict(color="tab:orange", marker="^"),
    "chebyshev": dict(color="tab:green", marker="v"),
    "minimax": dict(color="tab:red", marker="D"),
    "eigh_batched": dict(color="black", marker="*"),
    "eigh_loop": dict(color="tab:purple", marker="X"),
}
_OTHER_COLORS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def _style(method):
    """Fixed colours for the known methods; methods added later get the spare ones."""
    if method not in _STYLE:
        spare = len(_STYLE) - _KNOWN
        _STYLE[method] = dict(color=_OTHER_COLORS[spare % len(_OTHER_COLORS)], marker="P")
    return _STYLE[method]


_KNOWN = len(_STYLE)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _primary_rows(sweep):
    """The sweep rows at each (backend, n, p)'s largest batch."""
    largest = {}
    for r in sweep:
        key = (r["backend"], r["n"])
        largest[key] = max(largest.get(key, 0), r["batch"])
    return [r for r in sweep if r["batch"] == largest[(r["backend"], r["n"])]]


def _grid_axes(plt, rows, cols, width=5.0, height=3.6):
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows),
                             squeeze=False)
    return fig, axes


def _sweep_figure(plt, doc, value, ylabel, title, methods_filter, reference=None):
    rows = _primary_rows(doc["sweep"])
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    ps = sorted({r["p"] for r in rows})
    fig, axes = _grid_axes(plt, len(backends), len(ps))
    for i, backend in enumerate(backends):
        for j, p in enumerate(ps):
            ax = axes[i][j]
            here = [r for r in rows if r["backend"] == backend and r["p"] == p]
            for method in dict.fromkeys(r["method"] for r in here):
                if not methods_filter(method, here):
                    continue
                pts = sorted((r["n"], value(r)) for r in here
                             if r["method"] == method and value(r) is not None)
                if pts:
                    ax.plot(*zip(*pts), label=method, **_style(method))
            if reference is not None:
                ax.axhline(reference, color="black", linewidth=0.8, linestyle=":")
            ns = sorted({r["n"] for r in here})
            batches = {r["n"]: r["batch"] for r in here}
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ns, [f"{n}\nb={batches[n]}" for n in ns])
            ax.set_title(f"{backend}, p={p}")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"{title} (κ={doc['config']['kappa']:g}, {doc['config']['dtype']})")
    fig.tight_layout()
    return fig


def _tta_figures(plt, doc, out_dir):
    curves = doc["time_to_accuracy"]
    paths = []
    for axis in ("time", "matmuls"):
        for p in sorted({c["p"] for c in curves}):
            mine = [c for c in curves if c["p"] == p]
            kappas = sorted({c["kappa"] for c in mine})
            fig, axes = _grid_axes(plt, 1, len(kappas))
            for j, kappa in enumerate(kappas):
                ax = axes[0][j]
                here = [c for c in mine if c["kappa"] == kappa]
                ref = next((c["points"][0]["time_s"] for c in here
                            if c["method"] == "eigh_batched"), None)
                for curve in here:
                    _tta_curve(ax, curve, axis, ref)
                target = _target(doc, kappa)
                if target:
                    ax.axhline(target, color="black", linewidth=0.8, linestyle=":")
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.set_xlabel("time ÷ batched eigh time" if axis == "time" and ref
                              else "time (s)" if axis == "time" else "matmuls")
                ax.set_ylabel("max relative error")
                ax.set_title(f"κ = {kappa:g}")
                ax.grid(True, which="both", alpha=0.3)
            axes[0][-1].legend(fontsize=8)
            c0 = mine[0]
            fig.suptitle(f"error against {axis}, p={p} ({c0['backend']}, n={c0['n']}, "
                         f"b={c0['batch']}; big markers: default tolerance)")
            fig.tight_layout()
            path = Path(out_dir) / f"tta_{axis}_p{p}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            paths.append(path)
    return paths


def _target(doc, kappa):
    return TARGET_ERROR.get(kappa)


def _tta_curve(ax, curve, axis, ref):
    style = _style(curve["method"])
    method = curve["method"]

    def x_of(pt):
        if axis == "matmuls":
            return pt["matmuls"]
        return pt["time_s"] / ref if ref else pt["time_s"]

    swept = [pt for pt in curve["points"]
             if not pt["default"] and pt["err_max"] is not None]
    defaults = [pt for pt in curve["points"] if pt["default"] and pt["err_max"] is not None]
    if axis == "matmuls" and all(pt["matmuls"] == 0 for pt in curve["points"]):
        return  # eigh has no matmul count to place it by.
    if swept:
        ax.plot([x_of(pt) for pt in swept], [pt["err_max"] for pt in swept],
                color=style["color"], marker=style["marker"], markersize=3,
                linewidth=1, label=method)
    for pt in defaults:
        ax.plot([x_of(pt)], [pt["err_max"]], linestyle="none", markersize=10,
                markeredgecolor="black", label=None if swept else method, **style)


def _scaling_figure(plt, doc):
    rows = doc["scaling"]
    ps = sorted({r["p"] for r in rows})
    spectra = list(dict.fromkeys(r.get("spectrum", "geometric") for r in rows))
    fig, axes = _grid_axes(plt, len(spectra), len(ps))
    for (i, spread), (j, p) in itertools.product(enumerate(spectra), enumerate(ps)):
        ax = axes[i][j]
        here = [r for r in rows if r["p"] == p and r.get("spectrum", "geometric") == spread]
        ratio = max(r["frobenius_over_lambda_max"] for r in here)
        for method in dict.fromkeys(r["method"] for r in here):
            for scaling, line in (("power", "-"), ("frobenius", "--")):
                pts = sorted((r["kappa"], r["iterations"]) for r in here
                             if r["method"] == method and r["scaling"] == scaling)
                style = _style(method)
                ax.plot(*zip(*pts), linestyle=line, color=style["color"],
                        marker=style["marker"], label=f"{method}, {scaling}")
        ax.set_xscale("log")
        ax.set_xlabel("κ")
        ax.set_ylabel("iterations (max over the stack)")
        ax.set_title(f"p = {p}, {spread} spectrum (‖A‖_F/λmax ≤ {ratio:.1f})")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    r0 = rows[0]
    fig.suptitle(f"iterations at the default tolerance: power-iteration vs Frobenius "
                 f"scaling ({r0['backend']}, n={r0['n']}, b={r0['batch']})")
    fig.tight_layout()
    return fig


def make_plots(doc, out_dir) -> list:
    """Draw every figure the benchmark document has data for into ``out_dir``.

    Parameters
    ----------
    doc : dict or path
        The benchmark's JSON document, or the path of its file.
    out_dir : path
        Where the PNG files go.

    Returns
    -------
    list of Path
        The files written.

    Examples
    --------
    >>> from bench.plots import make_plots
    >>> make_plots({"schema": "matroot.bench.solvers/1"}, ".")
    []
    """
    if not isinstance(doc, dict):
        doc = json.loads(Path(doc).read_text())
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = None
    paths = []

    def save(fig, name):
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    if doc.get("sweep"):
        plt = plt or _pyplot()
        save(_sweep_figure(plt, doc, lambda r: r.get("ratio_to_eigh_batched"),
                           "time ÷ batched eigh time",
                           "time relative to batched eigh, default tolerance",
                           lambda m, rows: True, reference=1.0), "sweep_time_ratio.png")
        save(_sweep_figure(plt, doc, lambda r: r["matmul_equivalents"],
                           "time in batched matmuls",
                           "time in units of one batched matmul of the same size",
                           lambda m, rows: True), "sweep_matmul_equivalents.png")
        save(_sweep_figure(plt, doc, lambda r: r["efficiency"],
                           "time ÷ (matmuls × matmul time)",
                           "efficiency: distance from the matmul floor",
                           lambda m, rows: any(r["method"] == m and r["matmuls"]
                                               for r in rows), reference=1.0),
             "sweep_efficiency.png")
    if doc.get("time_to_accuracy"):
        plt = plt or _pyplot()
        paths += _tta_figures(plt, doc, out_dir)
    if doc.get("scaling"):
        plt = plt or _pyplot()
        save(_scaling_figure(plt, doc), "scaling_iterations.png")
    return paths
