"""Measurements behind the docs, and the figures and tables made from them.

``python docs/make_plots.py measure`` runs matroot on Shampoo-like factors and
writes JSON under ``docs/data/`` (committed, so the docs build needs no long
runs); ``python docs/make_plots.py render`` turns that JSON into the figures and
tables under ``docs/_generated/``. The Sphinx build runs ``render`` itself.

- ``scaling.json``: iterations against the condition number κ for power-iteration
  and Frobenius scaling (``inv_root_info(scaling=...)``), float64, so that
  rounding does not end the iterations early.
- ``methods.json``: worst relative error against a float64 eigh oracle,
  iterations, matmuls and convergence for every method, κ and precision.

The tables that describe the solvers themselves (support, overview) are
rendered from the solver registry by ``registry_tables.py``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
GENERATED = HERE / "_generated"

#: Shampoo-like test factors: n, gradient rank per step, steps, matrices per κ.
N = 128
GRADIENT_RANK = 16
STEPS = 4
MATRICES = 4
P = 4
SCALING_KAPPAS = [10.0 ** e for e in np.arange(1.0, 7.01, 0.5)]
SCALING_TOL = 1e-6
METHOD_KAPPAS = [1e2, 1e4, 1e6]
PRECISIONS = [("float32", None), ("float16 matmuls", "float16"),
              ("bfloat16 matmuls", "bfloat16")]


def gram_factors(seed: int = 0) -> np.ndarray:
    """``MATRICES`` float64 factors ``Σ_t G_t G_tᵀ`` (rank ≤ STEPS·GRADIENT_RANK < N),
    each normalised to λmax = 1, so a ridge ``eps`` gives κ = (1 + eps) / eps."""
    rng = np.random.default_rng(seed)
    out = np.empty((MATRICES, N, N))
    for i in range(MATRICES):
        total = np.zeros((N, N))
        for _ in range(STEPS):
            g = rng.standard_normal((N, GRADIENT_RANK)) @ rng.standard_normal(
                (GRADIENT_RANK, N))
            total += g @ g.T
        total = (total + total.T) / 2
        out[i] = total / np.linalg.eigvalsh(total)[-1]
    return out


def ridge_for(kappa: float) -> float:
    return 1.0 / (kappa - 1.0)


def oracle(a: np.ndarray, eps: float, p: float) -> np.ndarray:
    lam, q = np.linalg.eigh(a + eps * np.eye(a.shape[-1]))
    return (q * lam[..., None, :] ** (-1.0 / p)) @ np.swapaxes(q, -1, -2)


def relative_errors(x, exact: np.ndarray) -> np.ndarray:
    from matroot import _xp

    x = _xp.to_numpy(x).astype(np.float64)
    return np.linalg.norm(x - exact, axis=(-2, -1)) / np.linalg.norm(exact, axis=(-2, -1))


def _environment() -> dict:
    import matroot
    import torch

    return {"matroot": matroot.__version__, "numpy": np.__version__,
            "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "date": time.strftime("%Y-%m-%d")}


def measure_scaling() -> dict:
    """Per-matrix iterations of newton_db and coupled_newton against κ."""
    import matroot

    factors = gram_factors()
    frob_ratio = np.linalg.norm(factors, axis=(-2, -1))  # λmax = 1
    records = []
    for kappa in SCALING_KAPPAS:
        eps = ridge_for(kappa)
        for method in ("newton_db", "coupled_newton"):
            for scaling in ("power", "frobenius"):
                res = matroot.inv_root_info(factors, P, method=method, eps=eps,
                                            scaling=scaling, tol=SCALING_TOL,
                                            max_iter=200)
                records.append({
                    "kappa": kappa, "method": method, "scaling": scaling,
                    "iterations": np.asarray(res.iterations).tolist(),
                    "converged": np.asarray(res.converged).tolist(),
                    "rel_err_max": float(np.max(relative_errors(
                        res.root, oracle(factors, eps, P)))),
                })
    return {
        "what": f"iterations to a residual of {SCALING_TOL:g} (float64) for "
                f"(A + eps I)^(-1/{P}), {MATRICES} Shampoo factors sum of {STEPS} "
                f"G G^T of rank-{GRADIENT_RANK} gradients, n = {N}, lambda_max = 1, "
                "eps = 1/(kappa - 1)",
        "frobenius_over_lambda_max": frob_ratio.tolist(),
        "environment": _environment(),
        "records": records,
    }


def measure_methods() -> dict:
    """Accuracy and cost of every method by κ and precision (torch CPU, float32)."""
    import torch

    import matroot
    from matroot.solvers import SOLVERS

    factors = gram_factors(seed=1)
    runs = [(m, label, mm, {}) for m in SOLVERS for label, mm in PRECISIONS]
    runs.append(("newton_db", "float32", None, {"tol": 0.0, "max_iter": 10}))
    records = []
    for kappa in METHOD_KAPPAS:
        eps = ridge_for(kappa)
        exact = oracle(factors.astype(np.float32).astype(np.float64), eps, P)
        a = torch.from_numpy(factors.astype(np.float32))
        for method, label, matmul_dtype, extra in runs:
            if matmul_dtype not in SOLVERS[method].matmul_dtypes:
                continue  # the method has no such setting
            res = matroot.inv_root_info(a, P, method=method, eps=eps,
                                        matmul_dtype=matmul_dtype, **extra)
            errors = relative_errors(res.root, exact)
            records.append({
                "kappa": kappa, "method": method, "precision": label,
                "variant": "fixed 10 steps per square root" if extra else "default",
                "rel_err_max": float(np.max(errors)),
                "rel_err_median": float(np.median(errors)),
                "iterations": res.iterations.tolist(),
                "matmuls": res.matmuls.tolist(),
                "converged": res.converged.tolist(),
            })
    return {
        "what": f"(A + eps I)^(-1/{P}) of {MATRICES} Shampoo factors (sum of {STEPS} "
                f"G G^T, rank-{GRADIENT_RANK} gradients, n = {N}, lambda_max = 1, "
                "eps = 1/(kappa - 1)), float32 torch CPU input, default tol and "
                "max_iter; errors against a float64 eigh oracle of the float32 input",
        "environment": _environment(),
        "records": records,
    }


def plot_scaling(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {("newton_db", "power"): ("C0", "-", "o"),
              ("newton_db", "frobenius"): ("C0", "--", "s"),
              ("coupled_newton", "power"): ("C1", "-", "o"),
              ("coupled_newton", "frobenius"): ("C1", "--", "s")}
    for (method, scaling), (color, line, marker) in styles.items():
        recs = [r for r in data["records"]
                if r["method"] == method and r["scaling"] == scaling]
        kappas = [r["kappa"] for r in recs]
        iters = [float(np.median(r["iterations"])) for r in recs]
        ax.plot(kappas, iters, color=color, linestyle=line, marker=marker,
                markersize=4, label=f"{method}, {scaling} scaling")
    ax.set_xscale("log")
    ax.set_xlabel("condition number κ of A + eps·I")
    ax.set_ylabel("iterations (median of the stack)")
    ratio = np.median(data["frobenius_over_lambda_max"])
    ax.set_title(f"p = {P}, n = {N}, Shampoo factors with ‖A‖_F ≈ {ratio:.1f}·λmax",
                 fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt_err(value: float) -> str:
    return "diverged" if not np.isfinite(value) else f"{value:.0e}"


def methods_table_rst(data: dict) -> str:
    """A list-table: one row per (method, precision, variant), κ columns."""
    kappas = sorted({r["kappa"] for r in data["records"]})
    keys = list(dict.fromkeys((r["method"], r["precision"], r["variant"])
                              for r in data["records"]))
    cell = {(r["method"], r["precision"], r["variant"], r["kappa"]): r
            for r in data["records"]}
    head = ["method", "precision"] + [f"κ = {k:.0e}".replace("e+0", "e") for k in kappas]
    lines = [".. list-table::", "   :header-rows: 1", ""]
    lines.append("   * - " + "\n     - ".join(head))
    for method, precision, variant in keys:
        name = f"``{method}``" + ("" if variant == "default" else f" ({variant})")
        row = [name, precision]
        for k in kappas:
            r = cell.get((method, precision, variant, k))
            if r is None:
                row.append("")
                continue
            conv = sum(r["converged"])
            row.append(f"{_fmt_err(r['rel_err_max'])}, {max(r['iterations'])} it, "
                       f"{max(r['matmuls'])} mm"
                       + ("" if conv == len(r["converged"])
                          else f", {conv}/{len(r['converged'])} conv."))
        lines.append("   * - " + "\n     - ".join(row))
    return "\n".join(lines) + "\n"


def render(data_dir: Path = DATA, out_dir: Path = GENERATED) -> list[Path]:
    """Write the figures and tables the docs include; returns the paths written."""
    import registry_tables

    written = registry_tables.render(out_dir)
    scaling = data_dir / "scaling.json"
    if scaling.exists():
        path = out_dir / "scaling_iterations.png"
        plot_scaling(json.loads(scaling.read_text()), path)
        written.append(path)
    methods = data_dir / "methods.json"
    if methods.exists():
        path = out_dir / "methods_table.rst"
        path.write_text(methods_table_rst(json.loads(methods.read_text())))
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("measure", "render", "all"))
    args = parser.parse_args(argv)
    if args.step in ("measure", "all"):
        DATA.mkdir(exist_ok=True)
        for name, measure in (("scaling", measure_scaling), ("methods", measure_methods)):
            start = time.perf_counter()
            data = measure()
            (DATA / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
            print(f"wrote docs/data/{name}.json in {time.perf_counter() - start:.0f} s")
    if args.step in ("render", "all"):
        for path in render():
            print(f"wrote {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
