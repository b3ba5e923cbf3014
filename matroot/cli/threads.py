"""The thread policy of matroot's tools: how many BLAS/OpenMP/torch threads do the work.

The default is one thread per library. Timings on a machine shared with other
jobs are otherwise measurements of oversubscription: on this project's 2-core
machine under load, the demo took 214 s with the libraries' default pools and
15 s with one thread, and eigh's ranking against the matmul methods flipped.
One thread also makes ratios comparable across machines of different widths,
and it is what the committed results in ``bench/results/`` used. ``threads=0``
leaves the libraries' own defaults (all cores), for measuring a dedicated
multi-core machine.
"""

from __future__ import annotations

import contextlib
import os
import sys

from threadpoolctl import threadpool_info, threadpool_limits

__all__ = ["DEFAULT_THREADS", "THREAD_VARIABLES", "thread_policy", "thread_report",
           "describe_threads"]

DEFAULT_THREADS = 1
#: Read by OpenBLAS, MKL and OpenMP when they load (later imports, worker processes).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def thread_policy(threads: int):
    """Run the body with ``threads`` threads per library (0: the libraries' default).

    Sets the environment for libraries not loaded yet and for child processes,
    limits the pools already loaded (threadpoolctl) and torch's intra-op pool,
    and restores all three on exit. Idle OpenMP threads sleep rather than spin
    (``OMP_WAIT_POLICY=PASSIVE``, unless the caller chose otherwise): a spinning
    pool steals the cores the timed work runs on. Yields :func:`thread_report`.

    Examples
    --------
    >>> from matroot.cli.threads import thread_policy
    >>> with thread_policy(1) as report:
    ...     report["threads"]
    1
    """
    names = (*THREAD_VARIABLES, "OMP_WAIT_POLICY")
    saved_env = {name: os.environ.get(name) for name in names}
    torch = sys.modules.get("torch")
    saved_torch = torch.get_num_threads() if torch is not None else None
    limiter = None
    try:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if threads:
            for name in THREAD_VARIABLES:
                os.environ[name] = str(threads)
            limiter = threadpool_limits(limits=threads)
            if torch is not None:
                torch.set_num_threads(threads)
        yield thread_report(threads)
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if limiter is not None:
            limiter.restore_original_limits()
        if torch is not None and saved_torch is not None:
            torch.set_num_threads(saved_torch)


def thread_report(threads: int) -> dict:
    """The policy and the pools this process actually has: a JSON-able dict.

    Examples
    --------
    >>> from matroot.cli.threads import thread_report
    >>> thread_report(1)["policy"]
    '1 thread per library'
    """
    pools = {}
    for pool in threadpool_info():
        pools[pool.get("internal_api", "?")] = pool.get("num_threads")
    if "torch" in sys.modules:
        pools["torch"] = sys.modules["torch"].get_num_threads()
    policy = (f"{threads} thread{'s' if threads > 1 else ''} per library" if threads
              else "the libraries' default")
    return {"threads": threads, "policy": policy, "pools": pools,
            "cpu_count": os.cpu_count()}


def describe_threads(report: dict) -> str:
    """One line for a report's header, e.g. ``threads: 1 thread per library (...)``."""
    pools = ", ".join(f"{name} {count}" for name, count in report["pools"].items())
    return (f"threads: {report['policy']} (--threads; {report['cpu_count']} cores"
            + (f"; {pools}" if pools else "") + ")")
