"""Count the host↔device syncs of one solve on a CUDA GPU, per method.

A sync is what ``torch.cuda.set_sync_debug_mode("warn")`` reports: a device
value read on the host (``.item()``, ``bool(tensor)``, a copy to the CPU) or an
operation whose output size depends on device data. The design allows batched,
infrequent convergence checks and nothing else, so the count should grow with
the number of checks, not with the number of steps or matrices. Each row also
times the solve (median of a few runs, synchronised) and reports its
iterations, at 16 × 256² (dispatch-bound on a large GPU) and 8 × 1024²
(closer to bound by products). Run on a machine with a CUDA GPU::

    python -m bench gpu_syncs [--out FILE.json]

Rows go to stdout and, with ``--out``, to a JSON file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import matroot
from matroot.testing import scaled_spd_stack

#: (method, p) pairs counted; every built-in method at an order it takes.
CASES = (("evd", 2), ("newton_db", 2), ("newton_db", 4), ("coupled_newton", 2),
         ("coupled_newton", 4), ("minimax", 2), ("minimax", 4), ("chebyshev", 2))


def count_syncs(fn) -> tuple[int, object]:
    """The number of sync warnings ``fn()`` raises, and its result."""
    import torch

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return syncs, result


def median_time(fn, repeats: int = 5) -> float:
    """Median seconds of ``fn()`` over ``repeats`` synchronised runs, after one warm-up."""
    import torch

    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rows(batch: int = 16, n: int = 256, kappa: float = 1e4) -> list[dict]:
    """One row per (method, p): syncs, iterations, time, max error against float64."""
    import torch

    host = scaled_spd_stack(batch, n, kappa, seed=3).astype(np.float32)
    a = torch.asarray(host, device="cuda")
    evals, evecs = np.linalg.eigh(host.astype(np.float64))
    out = []
    for method, p in CASES:
        def solve(method=method, p=p):
            return matroot.inv_root_info(a, p, method=method)

        solve()  # warm-up: first-call kernel loads and caches are not the solver's syncs
        syncs, info = count_syncs(solve)
        exact = (evecs * evals[..., None, :] ** (-1.0 / p)) @ np.swapaxes(evecs, -1, -2)
        root = info.root.double().cpu().numpy()
        error = np.linalg.norm(root - exact, 2, axis=(-2, -1)) / np.linalg.norm(
            exact, 2, axis=(-2, -1))
        out.append({"method": method, "p": p, "batch": batch, "n": n, "kappa": kappa,
                    "syncs": syncs,
                    "max_iterations": int(info.iterations.max().item()),
                    "converged": int(info.converged.sum().item()),
                    "max_relative_error": float(error.max()),
                    "median_ms": median_time(solve) * 1e3})
        print(f"{batch}×{n}² {method:15s} p={p} syncs={syncs:3d} "
              f"iterations≤{out[-1]['max_iterations']:3d} "
              f"converged {out[-1]['converged']}/{batch} error {error.max():.1e} "
              f"{out[-1]['median_ms']:.1f} ms", flush=True)
    return out


def main(argv=None) -> int:
    """Count and print; exit 2 without a CUDA GPU."""
    parser = argparse.ArgumentParser(prog="python -m bench gpu_syncs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_syncs.py: no CUDA GPU", file=sys.stderr)
        return 2
    table = rows() + rows(batch=8, n=1024)
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                        "rows": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
