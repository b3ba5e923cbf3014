"""Copies between a backend's arrays and host NumPy arrays."""

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
