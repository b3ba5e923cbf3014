"""Benchmark workers: each backend is timed in a fresh interpreter of its own.

An idle BLAS or OpenMP pool of one library spins for a while after each call
and slows the other library's next call several-fold on a small machine, which
a real program using one library never sees. ``python -m bench.workers
JOB.json`` is the worker's entry point (internal: the parent writes the job file).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from matroot.cli.progress import Progress
from matroot.cli.threads import THREAD_VARIABLES, thread_policy
from matroot.testing.backends import target_named

from .config import config_from_json
from .scaling_iterations import scaling_iterations
from .sweep import sweep
from .time_to_accuracy import time_to_accuracy

__all__ = ["worker_environment", "run_worker", "json_default"]


def worker_environment(threads: int) -> dict:
    """The environment of the benchmark workers: this one's with the thread policy applied.

    ``OMP_WAIT_POLICY=PASSIVE`` (unless the caller set it) makes idle OpenMP
    threads sleep: with libgomp's default they spin at every barrier, and when
    other processes share the cores a spinning pool turns a 4 ms matmul into a
    16 ms one, which measures the neighbours rather than the solver.

    Examples
    --------
    >>> from bench.workers import worker_environment
    >>> env = worker_environment(1)
    >>> env["OPENBLAS_NUM_THREADS"], env["OMP_NUM_THREADS"]
    ('1', '1')
    """
    env = dict(os.environ)
    # The worker runs ``-m bench.workers``: this checkout must be importable from any folder.
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads:
        for name in THREAD_VARIABLES:
            env[name] = str(threads)
    return env


def json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def run_worker(folder: Path, job: dict, stream) -> dict:
    """Run one target's experiments in a fresh interpreter; return its results."""
    job_path = folder / f"worker_{job['target']}.json"
    job["out"] = str(folder / f"result_{job['target']}.json")
    job_path.write_text(json.dumps(job, default=json_default))
    # Progress goes straight to our stderr (a bar on a terminal); to any other
    # stream once the worker ends.
    live = stream is sys.stderr
    done = subprocess.run([sys.executable, "-m", "bench.workers", str(job_path)],
                          env=worker_environment(job["config"]["threads"]),
                          stderr=None if live else subprocess.PIPE, text=True)
    if not live:
        stream.write(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"the {job['target']} benchmark worker failed "
                           f"(exit status {done.returncode}); its error is printed above")
    return json.loads(Path(job["out"]).read_text())


def worker_main(job_path) -> int:
    job = json.loads(Path(job_path).read_text())
    config = config_from_json(job["config"])
    target = target_named(job["target"])
    progress = Progress(job["total"], done=job["done"], started=job["started"])
    problems = job["problems"]
    with thread_policy(config.threads) as threads:
        out = {"skipped": [], "workers": [dict(backend=target.name, **threads)]}
        if "sweep" in job["experiments"]:
            out["sweep"] = sweep(config, target, problems["sweep"], progress, out["skipped"])
        if "time_to_accuracy" in job["experiments"]:
            out["time_to_accuracy"] = time_to_accuracy(
                config, target, problems["time_to_accuracy"], progress)
        if "scaling" in job["experiments"]:
            out["scaling"] = scaling_iterations(config, target, problems["scaling"], progress)
    progress.close()
    Path(job["out"]).write_text(json.dumps(out, default=json_default))
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
