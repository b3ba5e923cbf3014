"""Copies between a backend's arrays and host NumPy arrays, and into row-major order."""

from __future__ import annotations

import numpy as np

from .namespace import (
    array_namespace,
    is_cupy_namespace,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
)

__all__ = [
    "to_numpy",
    "from_numpy",
    "row_major",
]


def to_numpy(x) -> np.ndarray:
    """Copy an array of any supported backend to a host NumPy array."""
    xp = array_namespace(x)
    if is_numpy_namespace(xp):
        return np.asarray(x)
    if is_torch_namespace(xp):
        return x.detach().cpu().numpy()
    if is_cupy_namespace(xp):
        return x.get()
    if is_jax_namespace(xp):  # NumPy's DLPack import takes CPU buffers only
        return np.asarray(x)
    return np.from_dlpack(x)


def from_numpy(xp, arr: np.ndarray, *, dtype=None, device=None):
    """Move a host NumPy array into namespace ``xp`` on ``device``."""
    # A copy: torch would share the buffer of a (possibly cached, read-only) array.
    arr = np.ascontiguousarray(arr).copy()
    if dtype is None:
        return xp.asarray(arr, device=device)
    return xp.astype(xp.asarray(arr, device=device), dtype)


def row_major(x):
    """``x`` in C (row-major) order: a NumPy array in another order (Fortran, negative
    or padded strides) is copied, as BLAS rounds its products differently for
    another layout (a Fortran-order stack's float64 roots differed from a C-order
    copy's by a few units in the last place). Other backends' arrays are returned as
    they are (torch's results were already layout-independent)."""
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    return x
