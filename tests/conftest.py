"""Backends for the test suite: every test taking ``backend`` runs on each of them.

They come from matroot's one backend registry (``matroot.testing.backends``), as the
CLI's and the benchmarks' do: numpy, torch, array_api_strict, jax (eager, float64
enabled), and torch-cuda and cupy where a GPU is present; a backend not installed
here is skipped with the reason.
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


from matroot.testing.backends import candidate_targets  # noqa: E402

#: Every backend the suite knows (matroot's one backend registry), each skipped with
#: the reason when it is not installed or has no device here: torch is optional.
BACKEND_PARAMS = [
    pytest.param(target, id=target.name,
                 marks=pytest.mark.skipif(missing is not None, reason=str(missing)))
    for target, missing in candidate_targets()
]

# The jax target's namespace turns JAX's float64 on (the float64 rows of the accuracy
# table need it); tests of x64-off set it off locally.
for _target, _missing in candidate_targets():
    if _target.backend == "jax" and _missing is None:
        _ = _target.xp


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request):
    """A :class:`matroot.testing.backends.Target`: ``.xp``, ``.xp_device`` (for ``device=``),
    ``.asarray(host, dtype)``, ``.name``."""
    return request.param


def to_numpy(x) -> np.ndarray:
    """Any backend's array as a float64-capable NumPy array."""
    from matroot._xp import to_numpy as convert
    out = convert(x)
    if out.dtype.name == "bfloat16" or str(out.dtype) == "bfloat16":
        out = out.astype(np.float32)
    return out
