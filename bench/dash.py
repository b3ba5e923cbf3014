"""DASH's inverse-root solvers from the ``ista-daslab-optimizers`` wheel, on any device.

DASH (IST Austria) ships Newton-DB and coupled Newton in float32 with a fixed step
count. Its package imports CUDA extensions and Triton code at the top; the solver
files themselves need only torch, so they are loaded under empty stand-ins for the
packages above them. When the wheel is not installed every entry point here says so
(None), and the benchmarks that compare against it skip that part.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

__all__ = ["DASH_SOLVERS", "DASH_STEPS", "dash_call", "load_dash_solvers"]

PACKAGE = "ista_daslab_optimizers"
#: DASH's two solvers, as matroot names the same iterations.
DASH_SOLVERS = ("newton_db", "coupled_newton")
#: Step counts tried, smallest first, for the cheapest that reaches a goal.
DASH_STEPS = (4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 20, 24)


def load_dash_solvers():
    """``(DashConfig, Newton-DB class, coupled Newton class)``, or None without the wheel.

    The package's ``__init__`` files import CUDA and Triton code: each is replaced by an
    empty package that only points at its directory, and the Triton helper the float32
    solvers never call by an empty module.
    """
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None and getattr(loaded, "__spec__", None) is None:
        root = Path(loaded.__path__[0])  # a stand-in of an earlier call
    else:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(next(iter(spec.submodule_search_locations)))
    for name, folder in ((PACKAGE, root), (f"{PACKAGE}.dash", root / "dash"),
                         (f"{PACKAGE}.dash.invertors", root / "dash" / "invertors"),
                         (f"{PACKAGE}.utils", root / "utils")):
        stand_in = types.ModuleType(name)
        stand_in.__path__ = [str(folder)]
        sys.modules.setdefault(name, stand_in)
    triton_helper = types.ModuleType(f"{PACKAGE}.utils.newton_schulz_triton")
    triton_helper.ns_line_1 = None
    sys.modules.setdefault(triton_helper.__name__, triton_helper)
    config = importlib.import_module(f"{PACKAGE}.dash.dash_config")
    ndb = importlib.import_module(f"{PACKAGE}.dash.invertors.inv_ndb")
    cn = importlib.import_module(f"{PACKAGE}.dash.invertors.inv_cn")
    return config.DashConfig, ndb.DashRootInvNewtonDB, cn.DashRootInvCoupledNewton


def dash_call(dash, name: str, a, p: int, eps: float, steps: int, *,
              float32_scale: bool = False, frobenius: bool = False):
    """A no-argument call that runs DASH's ``name`` solver for ``steps`` steps on ``a``.

    ``float32_scale``: DASH's scaling step computes in float64 by default; this runs it
    in float32 (one variant the comparisons try). ``frobenius``: scale by the Frobenius
    norm instead of DASH's default power iteration.
    """
    import torch

    config_type, ndb, cn = dash
    extra = {}
    if frobenius:
        kinds = importlib.import_module(f"{PACKAGE}.dash.types.matrix_scaling_type")
        extra["matrix_scaling_type"] = kinds.DashMatrixScalingType.FRO
    cfg = config_type(eps_inv_root=eps, newton_steps=steps, cn_tolerance=0.0,
                      matmul_dtype=torch.float32, **extra)
    solve = (ndb._matrix_root_inv_newton_db if name == "newton_db"
             else cn._matrix_root_inv_coupled_newton)
    scaling = importlib.import_module(f"{PACKAGE}.dash.invertors.scalers").DashMatrixScaling
    stock = scaling.__dict__["get_matrix_scaling"]

    def float32_scaling(a, cfg):
        return stock.__func__(a, cfg).float()

    def call():
        out = torch.empty_like(a)
        if float32_scale:
            scaling.get_matrix_scaling = staticmethod(float32_scaling)
        try:
            solve(inp=a, out=out, cfg=cfg, root=p)
        finally:
            scaling.get_matrix_scaling = stock
        return out

    return call
