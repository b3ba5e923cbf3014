"""``python -m bench polar``: products and time to an orthogonality defect, side by side.

Part one orthogonalizes batched random stacks with singular values log-spaced over
``[1/κ, 1]`` by Muon's 5-step quintic, by Polar Express with Muon's default here
(4 steps for ``[MUON_LOWER, 1]``, scaled by the product-free Gram-norm σmax bound
and by the Cholesky-certified one) and with the paper's Muon setting (``lower=1e-3``,
5 steps), by Polar Express at the fewest steps that reach the quintic's defect, built
either for the widest interval those steps bring within ``MUON_BAND`` of 1
(:func:`~matroot.solvers.polar.coefficients.band_lower`) or for the true ``1/κ``, by Polar
Express (with either σmax bound) and its Gram-side variant run to the float32 default
``rtol``, and by a batched SVD. The 64-wide shapes are the character-level model's
(``examples/muon_vs_adamw.py``).
Products of different sizes count alike (an m×n×n and an n×n×n product are one each),
so compare the Gram-side variant by time. Part two (issue 37's goal: defect ≤ 0.3 in
≤ 9 products at κ ≤ 100, ≤ 12 at κ ≤ 1e4, bfloat16 operands) runs the fewest-product
schedules with bfloat16 and float32 operands on the 64-wide stacks: the fitted
``rms_quintic`` (3 steps) with either σmax bound, Polar Express's best 3 steps (built for
``band_lower(3)``), Muon's default 4 steps and the quintic. Part three times
one Muon direction for a model's worth of matrices: stacked (one polar call per
shape) against a per-parameter loop. ``parts=`` runs some of them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

import matroot
from matroot.cli.timing import interleaved_times, timed_call
from matroot.optim.muon.core import MuonConfig, muon_directions, muon_init
from matroot.solvers.polar.coefficients import MUON_LOWER, MUON_POLAR_STEPS, band_lower
from matroot.solvers.polar.fitted import FITTED_QUINTICS
from matroot.testing import polar_case, polar_relative_error

__all__ = ["DEFAULTS", "PARTS", "run", "format_table"]

DEFAULTS: dict[str, dict[str, Any]] = {
    "quick": dict(shapes=((16, 128, 128), (8, 512, 128)), kappas=(1e2, 1e4), width=128,
                  layers=4, repeats=3, budget_s=2.0, fewest_shapes=((16, 64, 64),),
                  fewest_kappas=(1e2,)),
    "full": dict(shapes=((16, 64, 64), (16, 256, 64), (16, 256, 256), (8, 1024, 256),
                         (4, 512, 512), (8, 2048, 128)),
                 kappas=(1e1, 1e2, 1e3, 1e4), width=256, layers=8, repeats=5, budget_s=5.0,
                 fewest_shapes=((16, 64, 64), (16, 256, 64)),
                 fewest_kappas=(1e1, 3e1, 1e2, 1e3, 1e4)),
}
#: The report's parts (module docstring), in order.
PARTS = ("orthogonalization", "fewest_products", "muon_step")
#: Operand dtypes of part two.
FEWEST_OPERANDS = ("bfloat16", "float32")
#: The paper's Polar Express setting for Muon: lower bound and steps.
PAPER_LOWER, PAPER_STEPS = 1e-3, 5


def _fewest_steps(target, g, lower_for: Callable[[int], float],
                  quintic_error: float) -> dict | None:
    """The options of the fewest Polar Express steps (each built for ``lower_for(steps)``)
    whose defect is the quintic's or better."""
    for steps in range(1, 9):
        options: dict[str, Any] = dict(lower=lower_for(steps), max_iter=steps)
        info = matroot.polar_info(g, **options)
        if float(np.max(target.to_host(info.error_estimate))) <= quintic_error:
            return options
    return None


def _contenders(target, g, kappa: float, quintic_error: float) -> dict[str, dict]:
    """The options of each contender (module docstring)."""
    muon_default = f"polar_express, Muon's default ({MUON_POLAR_STEPS} steps, lower {MUON_LOWER:g})"
    options: dict[str, dict] = {
        "quintic (5 steps)": dict(method="quintic"),
        f"{muon_default}, Gram-norm bound":
            dict(lower=MUON_LOWER, max_iter=MUON_POLAR_STEPS, sigma_bound="gram_norm"),
        f"{muon_default}, Cholesky bound":
            dict(lower=MUON_LOWER, max_iter=MUON_POLAR_STEPS, sigma_bound="cholesky"),
        f"polar_express (lower {PAPER_LOWER:g}, {PAPER_STEPS} steps)":
            dict(lower=PAPER_LOWER, max_iter=PAPER_STEPS),
        f"rms_quintic ({len(FITTED_QUINTICS)} fitted steps), Cholesky bound":
            dict(method="rms_quintic")}
    for label, lower_for in (("band lower", band_lower),
                             ("lower 1/κ", lambda steps: min(0.5, 1.0 / kappa))):
        cut = _fewest_steps(target, g, lower_for, quintic_error)
        if cut is not None:
            options[f"polar_express ({label}) at the quintic's defect"] = cut
    for bound in ("gram_norm", "cholesky"):
        options[f"polar_express (float32 rtol), {bound} bound"] = dict(sigma_bound=bound)
    options["gram_newton_schulz (float32 rtol)"] = dict(method="gram_newton_schulz")
    options["svd"] = dict(method="svd")
    return options


def _orthogonalization_rows(target, shape, kappa, repeats, budget_s) -> list[dict]:
    batch, m, n = shape
    case = polar_case(np.random.default_rng(int(kappa) % 101), (batch,), m, n, kappa)
    g = target.asarray(case.g, "float32")
    quintic = matroot.polar_info(g, method="quintic")
    quintic_error = float(np.max(target.to_host(quintic.error_estimate)))
    options = _contenders(target, g, kappa, quintic_error)
    calls: dict[Hashable, tuple[Callable, float]] = {}
    results = {}
    for name, opts in options.items():
        seconds, results[name] = timed_call(lambda o=opts: matroot.polar_info(g, **o),
                                            target.synchronize)
        calls[name] = (lambda o=opts: matroot.polar_info(g, **o), seconds)
    times = interleaved_times(calls, target.synchronize, repeats=repeats, budget_s=budget_s)
    svd_time = statistics.median(times["svd"])
    rows = []
    for name, result in results.items():
        median = statistics.median(times[name])
        error = polar_relative_error(result.root, case.polar)
        rows.append(dict(shape=list(shape), kappa=kappa, contender=name,
                         products=int(np.max(target.to_host(result.matmuls))),
                         defect=float(np.max(target.to_host(result.error_estimate))),
                         error=float(np.max(error)), seconds=median,
                         time_vs_svd=median / svd_time,
                         converged=bool(np.all(target.to_host(result.converged)))))
    return rows


def _fewest_contenders() -> dict[str, dict]:
    steps = len(FITTED_QUINTICS)
    return {f"rms_quintic ({steps} fitted steps), Cholesky bound": dict(method="rms_quintic"),
            f"rms_quintic ({steps} fitted steps), Gram-norm bound":
                dict(method="rms_quintic", sigma_bound="gram_norm"),
            "polar_express, 3 steps for band_lower(3)": dict(lower=band_lower(3), max_iter=3),
            f"polar_express, Muon's default ({MUON_POLAR_STEPS} steps, lower {MUON_LOWER:g})":
                dict(lower=MUON_LOWER, max_iter=MUON_POLAR_STEPS),
            "quintic (5 steps)": dict(method="quintic"),
            "svd": dict(method="svd")}


def _fewest_rows(target, shape, kappa, repeats, budget_s) -> list[dict]:
    """Part two for one stack: every contender with each operand dtype, timed together."""
    batch, m, n = shape
    case = polar_case(np.random.default_rng(int(kappa) % 101), (batch,), m, n, kappa)
    g = target.asarray(case.g, "float32")
    calls: dict[Hashable, tuple[Callable, float]] = {}
    results = {}
    for operands in FEWEST_OPERANDS:
        for name, opts in _fewest_contenders().items():
            opts = dict(opts, matmul_dtype=None if operands == "float32" else operands)
            key = (operands, name)
            try:
                seconds, results[key] = timed_call(lambda o=opts: matroot.polar_info(g, **o),
                                                   target.synchronize)
            except ValueError:  # no such operand dtype on this backend (NumPy: bfloat16)
                break
            calls[key] = (lambda o=opts: matroot.polar_info(g, **o), seconds)
    times = interleaved_times(calls, target.synchronize, repeats=repeats, budget_s=budget_s)
    rows = []
    for (operands, name), result in results.items():
        median = statistics.median(times[(operands, name)])
        svd_time = statistics.median(times[(operands, "svd")])
        rows.append(dict(shape=list(shape), kappa=kappa, operands=operands, contender=name,
                         products=int(np.max(target.to_host(result.matmuls))),
                         defect=float(np.max(target.to_host(result.error_estimate))),
                         error=float(np.max(polar_relative_error(result.root, case.polar))),
                         seconds=median, time_vs_svd=median / svd_time))
    return rows


def _model_gradients(target, width: int, layers: int) -> list:
    """A transformer-like set of matrices: per layer four width² and two width×4width."""
    rng = np.random.default_rng(0)
    shapes = [(width, width)] * 4 + [(4 * width, width), (width, 4 * width)]
    return [target.asarray(rng.standard_normal(s), "float32")
            for _ in range(layers) for s in shapes]


def _muon_step_rows(target, width, layers, repeats, budget_s) -> list[dict]:
    grads = _model_gradients(target, width, layers)
    use = [True] * len(grads)
    config = MuonConfig()
    state = muon_init(grads, use)

    def stacked():
        return muon_directions(grads, state, use, config)

    def loop():
        return [muon_directions([g], muon_init([g], [True]), [True], config) for g in grads]

    calls: dict[Hashable, tuple[Callable, float]] = {}
    for name, fn in (("stacked", stacked), ("per-parameter loop", loop)):
        calls[name] = (fn, timed_call(fn, target.synchronize)[0])
    times = interleaved_times(calls, target.synchronize, repeats=repeats, budget_s=budget_s)
    loop_time = statistics.median(times["per-parameter loop"])
    return [dict(matrices=len(grads), width=width, contender=name,
                 seconds=statistics.median(t), speedup_vs_loop=loop_time / statistics.median(t))
            for name, t in times.items()]


def run(target, *, quick: bool = False, progress=None, parts=PARTS) -> dict:
    """The ``parts`` (:data:`PARTS`) on ``target``; a JSON-able report."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    settings = DEFAULTS["quick" if quick else "full"]
    report: dict[str, Any] = dict(backend=target.name, quick=quick)
    for part, shapes, kappas, rows_of in (
            ("orthogonalization", settings["shapes"], settings["kappas"],
             _orthogonalization_rows),
            ("fewest_products", settings["fewest_shapes"], settings["fewest_kappas"],
             _fewest_rows)):
        if part not in parts:
            continue
        report[part] = []
        for shape in shapes:
            for kappa in kappas:
                report[part] += rows_of(target, shape, kappa, settings["repeats"],
                                        settings["budget_s"])
                if progress is not None:
                    progress.step(f"{part} {shape} κ={kappa:g}")
    if "muon_step" in parts:
        report["muon_step"] = _muon_step_rows(target, settings["width"], settings["layers"],
                                              settings["repeats"], settings["budget_s"])
    return report


def format_table(report: dict) -> str:
    """Markdown tables of a :func:`run` report (the parts it has)."""
    lines: list[str] = []
    if "orthogonalization" in report:
        lines += _orthogonalization_table(report)
    if "fewest_products" in report:
        lines += ["",
                  f"Fewest products ({report['backend']}): max over the stack of the defect and "
                  "of the error vs the exact polar factor; time / svd with the same operands",
                  "", "| shape (b, m, n) | κ | operands | contender | products | defect | error "
                      "| ms | time / svd |", "|---|---|---|---|---|---|---|---|---|"]
        for r in report["fewest_products"]:
            lines.append(f"| {tuple(r['shape'])} | {r['kappa']:g} | {r['operands']} | "
                         f"{r['contender']} | {r['products']} | {r['defect']:.3f} | "
                         f"{r['error']:.3f} | {r['seconds'] * 1e3:.1f} | "
                         f"{r['time_vs_svd']:.2f} |")
    if "muon_step" in report:
        lines += _muon_table(report)
    return "\n".join(lines).lstrip("\n")


def _orthogonalization_table(report: dict) -> list[str]:
    lines = [f"Orthogonalization ({report['backend']}, float32): max over the stack of the "
             "defect ‖QᵀQ − I‖_F/√n and of the error vs the exact polar factor",
             "", "| shape (b, m, n) | κ | contender | products | defect | error | ms | "
                 "time / svd |", "|---|---|---|---|---|---|---|---|"]
    for r in report["orthogonalization"]:
        lines.append(f"| {tuple(r['shape'])} | {r['kappa']:g} | {r['contender']} | "
                     f"{r['products']} | {r['defect']:.1e} | {r['error']:.1e} | "
                     f"{r['seconds'] * 1e3:.1f} | {r['time_vs_svd']:.2f} |")
    return lines


def _muon_table(report: dict) -> list[str]:
    lines = ["", f"Muon direction for a model's matrices (polar_express, {MUON_POLAR_STEPS} "
              f"steps, lower {MUON_LOWER:g})", "",
              "| matrices | width | contender | ms | speed-up vs loop |", "|---|---|---|---|---|"]
    for r in report["muon_step"]:
        lines.append(f"| {r['matrices']} | {r['width']} | {r['contender']} | "
                     f"{r['seconds'] * 1e3:.1f} | {r['speedup_vs_loop']:.2f} |")
    return lines
