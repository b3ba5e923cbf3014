"""Backends for the test suite: every test taking ``xp`` runs on each of them.

numpy, array_api_strict and torch (CPU) always; jax (eager, with float64 enabled)
when installed; torch-cuda and cupy only when a GPU is present (they are skipped
with a reason otherwise).
"""

from __future__ import annotations

import os

# One BLAS/OpenMP thread per process unless MATROOT_TEST_THREADS says otherwise: on a
# shared 2-core machine multi-threaded BLAS oversubscribes and runs 10-40x slower.
# Set before numpy/torch load their thread pools; threadpoolctl covers those already loaded.
TEST_THREADS = int(os.environ.get("MATROOT_TEST_THREADS", "1"))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, str(TEST_THREADS))

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

threadpool_limits(TEST_THREADS)
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci")


def _torch_cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _jax_available() -> bool:
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def _cupy_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


class Backend:
    """An array namespace plus the device its test arrays go to."""

    def __init__(self, name):
        self.name = name
        if name == "numpy":
            import array_api_compat.numpy as xp
            self.device = None
        elif name == "array_api_strict":
            import array_api_strict as xp
            self.device = None
        elif name in ("torch", "torch-cuda"):
            import array_api_compat.torch as xp
            self.device = "cpu" if name == "torch" else "cuda"
        elif name == "cupy":
            import array_api_compat.cupy as xp
            self.device = None
        elif name == "jax":
            import jax
            import jax.numpy as xp

            # The float64 rows of the tests need it; tests of x64-off set it locally.
            jax.config.update("jax_enable_x64", True)
            self.device = None
        self.xp = xp

    def asarray(self, a, dtype=None):
        """Put a NumPy array on this backend (optionally casting to a dtype name)."""
        a = np.asarray(a)
        if self.name in ("torch", "torch-cuda"):
            import torch
            out = torch.asarray(a, device=self.device)
        elif self.name == "cupy":
            import cupy
            out = cupy.asarray(a)
        else:
            out = self.xp.asarray(a)
        if dtype is not None:
            out = self.xp.astype(out, getattr(self.xp, dtype) if isinstance(dtype, str)
                                 else dtype)
        return out

    def __repr__(self):
        return self.name


BACKEND_PARAMS = [
    pytest.param("numpy", id="numpy"),
    pytest.param("array_api_strict", id="array_api_strict"),
    pytest.param("torch", id="torch"),
    pytest.param("jax", id="jax",
                 marks=pytest.mark.skipif(not _jax_available(), reason="jax is not installed")),
    pytest.param("torch-cuda", id="torch-cuda",
                 marks=pytest.mark.skipif(not _torch_cuda_available(),
                                          reason="no CUDA GPU for torch")),
    pytest.param("cupy", id="cupy",
                 marks=pytest.mark.skipif(not _cupy_available(),
                                          reason="CuPy or a GPU is not available")),
]


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request):
    return Backend(request.param)


def to_numpy(x) -> np.ndarray:
    """Any backend's array as a float64-capable NumPy array."""
    from matroot._xp import to_numpy as convert
    out = convert(x)
    if out.dtype.name == "bfloat16" or str(out.dtype) == "bfloat16":
        out = out.astype(np.float32)
    return out
