"""The stacks a solver-benchmark run measures, drawn once and saved with their oracles.

The parent process draws every stack and solves its float64 oracle before any
worker starts, so the workers that time the backends share the same matrices
and spend no time (and wake no BLAS threads) on the oracle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from matroot.testing import SPDCase, scaled_spd_stack

__all__ = ["prepare_problems", "load_problem"]


def prepare_problems(config, folder: Path, stream) -> dict:
    """Draw every stack once, solve its oracle in float64, and save both to ``folder``.

    Done in the parent process, so the workers that time the backends share the
    same matrices and spend no time (and wake no BLAS threads) on the oracle.
    """
    dtype = np.dtype(config.dtype)
    index: dict[str, list] = {"sweep": [], "time_to_accuracy": [], "scaling": []}

    def save(name, a, ps, **extra):
        oracle = SPDCase(a, 0.0, name)
        path = folder / f"{name}.npz"
        np.savez(path, a=a, **{f"exact_p{p}": oracle.inv_root(p) for p in ps})
        return dict(path=str(path), **extra)

    print("preparing matrices and their float64 eigh oracles", file=stream, flush=True)
    if "sweep" in config.experiments:
        for n in config.sizes:
            for batch in config.batches_for(n):
                seed = config.seed + 7 * n + batch
                a = scaled_spd_stack(batch, n, config.kappa, seed=seed, dtype=dtype)
                index["sweep"].append(save(f"sweep_n{n}_b{batch}", a, config.ps, n=n,
                                           batch=batch, kappa=config.kappa, seed=seed))
    if "time_to_accuracy" in config.experiments:
        for i, kappa in enumerate(config.tta_kappas):
            seed = config.seed + 101 + i
            a = scaled_spd_stack(config.tta_batch, config.tta_n, kappa, seed=seed,
                                 dtype=dtype)
            index["time_to_accuracy"].append(save(f"tta_{i}", a, config.ps,
                                                  n=config.tta_n, batch=config.tta_batch,
                                                  kappa=kappa, seed=seed))
    if "scaling" in config.experiments:
        for spread in config.scaling_spectra:
            for i, kappa in enumerate(config.scaling_kappas):
                seed = config.seed + 211
                a = scaled_spd_stack(config.scaling_batch, config.scaling_n, kappa,
                                     seed=seed, dtype=dtype, spread=spread)
                wide = a.astype(np.float64)
                top = np.linalg.eigvalsh(wide)[:, -1]
                ratio = float(np.max(np.sqrt(np.sum(wide * wide, axis=(-2, -1))) / top))
                index["scaling"].append(save(
                    f"scaling_{spread}_{i}", a, config.ps, n=config.scaling_n,
                    batch=config.scaling_batch, kappa=kappa, spectrum=spread, seed=seed,
                    frobenius_over_lambda_max=ratio))
    return index


def load_problem(entry, ps):
    with np.load(entry["path"]) as data:
        return data["a"], {p: data[f"exact_p{p}"] for p in ps}

