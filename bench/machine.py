"""What machine a measurement ran on: processor, cores, library versions, BLAS, threads."""

from __future__ import annotations

import os
import platform
import re

import numpy as np

from matroot.testing.backends import discover

__all__ = ["machine_description"]

_ENVIRONMENT = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY")


def machine_description(targets, environment: dict) -> dict:
    """Processor, core count, versions of the ``targets``' libraries and BLAS of this machine.

    ``environment`` is the environment the measuring processes run with; its
    thread variables are recorded.
    """
    versions = {info.name: info.version for info in discover(
        list(dict.fromkeys(t.backend for t in targets)))}
    info = dict(platform=platform.platform(), python=platform.python_version(),
                processor=_cpu_model(), cpu_count=os.cpu_count(), numpy=np.__version__,
                backends={t.name: dict(device=t.device, version=versions[t.backend])
                          for t in targets},
                worker_environment={k: environment[k] for k in _ENVIRONMENT
                                    if k in environment})
    if any(t.backend == "torch" for t in targets):
        import torch

        shown = torch.__config__.show()
        info["torch_build"] = {key: match.group(1) for key in
                               ("BLAS_INFO", "LAPACK_INFO", "CPU capability usage")
                               if (match := re.search(re.escape(key) + r"[=:]\s*([^,\n]+)",
                                                      shown))}
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
