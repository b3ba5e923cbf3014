"""The docs' tables that describe the solvers, rendered from the solver registry.

``methods.rst`` includes the method overview and ``support.rst`` the backend
support table; both are written by :func:`render` (called from
``make_plots.render`` at the start of every Sphinx build), so a solver added to
the registry appears in them with no edit here.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import NamedTuple


class BackendColumn(NamedTuple):
    """A column of the support table: a backend on a device and what it offers."""

    label: str
    backend: str
    device: str
    float16: bool
    bfloat16: bool
    #: Whether 16-bit GEMMs run as such (CUDA torch); elsewhere operands are
    #: rounded to 16 bits and multiplied in float32 (:class:`matroot._xp.Matmul`).
    native_16bit_matmuls: bool


#: The backends the support page describes (GPU columns: CUDA torch, CuPy).
BACKEND_COLUMNS = (
    BackendColumn("numpy", "numpy", "cpu", True, False, False),
    BackendColumn("torch (CPU)", "torch", "cpu", True, True, False),
    BackendColumn("torch (CUDA)", "torch", "cuda:0", True, True, True),
    BackendColumn("cupy", "cupy", "cuda:0", True, False, False),
    BackendColumn("array_api_strict", "array_api_strict", "cpu", False, False, False),
    BackendColumn("jax (CPU)", "jax", "cpu", True, True, False),
)


def support_status(spec, dtype: str, matmul_dtype: str | None, column: BackendColumn) -> str:
    """What the support page claims for one solver, precision and backend column.

    ``yes``, ``emulated`` (16-bit operands rounded on a CPU), ``ignored`` (a
    method that forms no matmuls) or ``no`` (a ValueError).
    """
    if dtype not in spec.compute_dtypes:
        return "no"
    if matmul_dtype is None:
        return "yes"
    if not getattr(column, matmul_dtype) or matmul_dtype not in spec.matmul_dtypes:
        return "no"
    if not spec.forms_matmuls:
        return "ignored"
    return "yes" if column.native_16bit_matmuls else "emulated"


def support_rows() -> list[dict]:
    """One row per (registered solver, precision of ``matroot info``), one cell per column."""
    from matroot.cli.info import PRECISIONS
    from matroot.solvers import SOLVERS

    rows = []
    for name, spec in SOLVERS.items():
        for label, dtype, matmul_dtype, _ in PRECISIONS:
            row = {"method": name, "precision": label}
            row.update({c.label: support_status(spec, dtype, matmul_dtype, c)
                        for c in BACKEND_COLUMNS})
            rows.append(row)
    return rows


def support_csv() -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, ["method", "precision", *(c.label for c in BACKEND_COLUMNS)],
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(support_rows())
    return out.getvalue()


def solvers_table_rst() -> str:
    """A list-table of the registered solvers: p, cost, what each is for."""
    from matroot.solvers import SOLVERS

    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 16 20 30 34", "",
             "   * - method", "     - p", "     - cost (n×n matmuls)", "     - use it for"]
    for name, spec in SOLVERS.items():
        lines += [f"   * - ``{name}``", f"     - {spec.root_orders.description}",
                  f"     - {spec.cost_summary}", f"     - {spec.summary}"]
    return "\n".join(lines) + "\n"


def render(out_dir: Path) -> list[Path]:
    """Write ``support.csv`` and ``solvers_table.rst`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    support = out_dir / "support.csv"
    support.write_text(support_csv(), encoding="utf-8")
    table = out_dir / "solvers_table.rst"
    table.write_text(solvers_table_rst(), encoding="utf-8")
    return [support, table]
