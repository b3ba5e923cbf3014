"""Eigenbasis refresh vs a batched float32 eigh, side by side on this machine.

The stacks are Shampoo factors one preconditioner update apart: ``L`` is an EMA
(β₂ = 0.95) of Gram matrices of gradients whose leading directions drift a little each
step (ranks cycled over n/32, n/8, n/2 and n across the blocks); the previous basis is
the float64 eigenvectors of ``L``, rounded to float32; the refresh is asked for those
of ``L' = 0.95·L + 0.05·G·Gᵀ``. Times are medians of alternating rounds (eigh, then
each refresh setting), with the library's default thread count. Accuracy is graded by
``matroot.testing.eigenbasis_errors`` against the float64 eigh oracle.

Usage: ``python -m bench eigenbasis_refresh`` (8 × 384², a few rounds);
``--large`` adds 16 × 1024² (minutes). Writes bench/results/eigenbasis.{json,md}
(``--only-large``: 16 × 1024² alone, into eigenbasis_large.{json,md}).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import matroot
from matroot.testing import eigenbasis_errors

RESULTS = Path(__file__).parent / "results"
#: (label, options of refresh_eigenbasis): the default call first.
SETTINGS = (
    ("block (default)", {}),
    ("block, no fallback", {"fallback": "none"}),
    ("block of n/4, no fallback", {"fallback": "none", "block": "n/4"}),
    ("block, rtol=1e-3, no fallback", {"fallback": "none", "rtol": 1e-3, "iterations": 4}),
    ("orthogonal, 1 step, no fallback", {"method": "orthogonal", "iterations": 1,
                                         "fallback": "none"}),
)


def soap_factors(batch: int, n: int, *, seed: int = 0, steps: int = 20, beta: float = 0.95):
    """(previous basis, new factor) as float64 stacks, as the module docstring says."""
    rng = np.random.default_rng(seed)
    ranks = [max(1, n // 32), max(1, n // 8), max(1, n // 2), n]
    previous, new = np.empty((batch, n, n)), np.empty((batch, n, n))
    for i in range(batch):
        rank = ranks[i % len(ranks)]
        directions = np.linalg.qr(rng.standard_normal((n, rank)))[0]
        weights = np.geomspace(1.0, 0.05, rank)
        factor = np.zeros((n, n))
        for step in range(steps + 1):
            directions = np.linalg.qr(directions + 0.1 * rng.standard_normal((n, rank))
                                      / np.sqrt(n))[0]
            g = directions * weights + 0.01 * rng.standard_normal((n, rank)) / np.sqrt(n)
            if step == steps:
                previous[i] = factor
            factor = beta * factor + (1 - beta) * (g @ g.T)
        new[i] = factor
    return np.linalg.eigh(previous)[1], new


def _median_times(calls: dict, rounds: int) -> tuple[dict, dict]:
    """Median wall-clock and process CPU seconds per call (the CPU time is what a
    machine shared with other work still measures fairly)."""
    wall: dict = {name: [] for name in calls}
    cpu: dict = {name: [] for name in calls}
    for call in calls.values():  # warm-up (JIT caches, allocator)
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return ({name: statistics.median(v) for name, v in wall.items()},
            {name: statistics.median(v) for name, v in cpu.items()})


def _grades(new64, vectors, values) -> dict:
    """eigenbasis_errors one matrix at a time (a 16 × 1024² float64 stack's temporaries
    exhausted a shared machine's memory)."""
    vectors, values = np.asarray(vectors), np.asarray(values)
    each = [eigenbasis_errors(new64[i], vectors[i], values[i]) for i in range(len(new64))]
    return {key: np.array([float(e[key]) for e in each]) for key in each[0]}


def measure(backend: str, batch: int, n: int, rounds: int, settings=SETTINGS) -> list[dict]:
    basis64, new64 = soap_factors(batch, n)
    if backend == "torch":
        import torch

        a, q = torch.tensor(new64, dtype=torch.float32), torch.tensor(basis64,
                                                                     dtype=torch.float32)
        eigh = torch.linalg.eigh
    else:
        a, q = new64.astype(np.float32), basis64.astype(np.float32)
        eigh = np.linalg.eigh
    calls = {"eigh": lambda: eigh(a)}
    for label, options in settings:
        options = {k: (n // 4 if v == "n/4" else v) for k, v in options.items()}
        calls[label] = lambda o=options: matroot.refresh_eigenbasis(a, q, **o)
    rtols = {label: options.get("rtol", matroot.eigenbasis.DEFAULT_RTOL)
             for label, options in settings}
    times, cpu = _median_times(calls, rounds)
    previous = _grades(new64, basis64, np.sum(basis64 * (new64 @ basis64), axis=-2))
    rows = [{"backend": backend, "batch": batch, "n": n, "method": "previous basis",
             "seconds": 0.0, "ratio_to_eigh": 0.0, "cpu_ratio_to_eigh": 0.0,
             "converged": 0, "fallbacks": 0,
             "residual_max": float(previous["reconstruction"].max()),
             "reconstruction_max": float(previous["reconstruction"].max()),
             "eigenvalue_error_max": float(previous["eigenvalues"].max()),
             "converged_wrong": 0}]
    w, v = eigh(a)
    grades = _grades(new64, v, w)
    rows.append({"backend": backend, "batch": batch, "n": n, "method": "eigh float32",
                 "seconds": times["eigh"], "ratio_to_eigh": 1.0, "cpu_ratio_to_eigh": 1.0,
                 "converged": batch,
                 "fallbacks": 0, "residual_max": float("nan"),
                 "reconstruction_max": float(grades["reconstruction"].max()),
                 "eigenvalue_error_max": float(grades["eigenvalues"].max()),
                 "converged_wrong": 0})
    for name in calls:
        if name == "eigh":
            continue
        result = calls[name]()
        grades = _grades(new64, result.eigenvectors, result.eigenvalues)
        converged = np.asarray(result.converged, dtype=bool)
        wrong = converged & ((grades["reconstruction"] > rtols[name])
                             | (grades["eigenvalues"] > rtols[name])
                             | (grades["orthogonality"] > rtols[name]))
        rows.append({"backend": backend, "batch": batch, "n": n, "method": name,
                     "seconds": times[name], "ratio_to_eigh": times[name] / times["eigh"],
                     "cpu_ratio_to_eigh": cpu[name] / cpu["eigh"],
                     "converged": int(converged.sum()), "fallbacks": result.fallbacks,
                     "residual_max": float(np.max(np.asarray(result.residual))),
                     "reconstruction_max": float(grades["reconstruction"].max()),
                     "eigenvalue_error_max": float(grades["eigenvalues"].max()),
                     "converged_wrong": int(wrong.sum())})
    return rows


def markdown(rows: list[dict], machine: str) -> str:
    lines = [f"# Eigenbasis refresh vs batched float32 eigh ({machine})", "",
             f"rtol = {matroot.eigenbasis.DEFAULT_RTOL} (the default) unless the row says; errors "
             "relative to ‖A‖_F against the float64 oracle; times are medians of alternating "
             "rounds.", "",
             "| backend | stack | method | time (s) | × eigh | CPU × eigh | converged | eigh "
             "fallbacks | residual max | reconstruction max | eigenvalue error max | "
             "converged but wrong |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['batch']} × {r['n']}² | {r['method']} | "
            f"{r['seconds']:.3f} | {r['ratio_to_eigh']:.2f} | {r['cpu_ratio_to_eigh']:.2f} | "
            f"{r['converged']}/{r['batch']} | "
            f"{r['fallbacks']} | {r['residual_max']:.2e} | {r['reconstruction_max']:.2e} | "
            f"{r['eigenvalue_error_max']:.2e} | {r['converged_wrong']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--large", action="store_true", help="also 16 × 1024² (minutes)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="torch,numpy")
    parser.add_argument("--only-large", action="store_true", help="16 × 1024² alone")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: the default); 1 is steadier on a loaded machine")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    shapes = ([] if args.only_large else [(8, 384)]) + (
        [(16, 1024)] if args.large or args.only_large else [])
    rows = []
    for batch, n in shapes:
        for backend in args.backends.split(","):
            settings = SETTINGS if n < 1024 else SETTINGS[:2] + SETTINGS[-1:]
            if backend == "numpy":  # numpy's n×n QR took 40 s a call at 8 × 384²
                settings = tuple(s for s in settings if s[1].get("method") != "orthogonal")
            rows.extend(measure(backend, batch, n, args.rounds, settings))
            print(markdown(rows[-(2 + len(settings)):], platform.processor() or "CPU"),
                  flush=True)
    import torch

    machine = (f"{platform.machine()} CPU, {platform.system()}, load {os.getloadavg()[0]:.1f}, "
               f"{torch.get_num_threads()} torch thread(s), {os.cpu_count()} cores")
    RESULTS.mkdir(exist_ok=True)
    name = "eigenbasis_large" if args.only_large else "eigenbasis"
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine, "rows": rows},
                                                     indent=1))
    (RESULTS / f"{name}.md").write_text(markdown(rows, machine))


if __name__ == "__main__":
    main()
