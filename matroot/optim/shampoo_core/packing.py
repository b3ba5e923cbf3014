"""Symmetric matrices stored as their upper triangles, row by row: ``n(n+1)/2`` numbers.

Distributed Shampoo's ``use_symmetric_packing``: a ``(k, n, n)`` stack of factors or
roots is kept as ``(k, n(n+1)/2)``. The index arrays that pack, unpack and read the
diagonal are made once per size and device, so no index is copied to the device per
step.
"""

from __future__ import annotations

import numpy as np

from ... import _xp

__all__ = ["pack", "unpack", "diagonals"]


_INDEX_CACHE: dict = {}


def _cached_index(like, key: tuple, make):
    """The index ``make()`` gives, on ``like``'s device: kept once per key, library and
    device (:func:`matroot._xp.kept`), so no index is copied to the device per step."""
    xp, device = _xp.array_namespace(like), _xp.device_of(like)
    return _xp.kept(_INDEX_CACHE, (xp.__name__, str(device), *key), 512,
                    lambda: _on_device(xp, make(), device))


def _packing_index(like, n: int, unpack: bool):
    """Flat indices that pack an ``n×n`` matrix's upper triangle (row by row) or unpack it."""
    def make():
        rows, cols = np.triu_indices(n)
        if not unpack:
            return rows * n + cols
        position = np.empty((n, n), dtype=np.int64)
        position[rows, cols] = np.arange(rows.size)
        position[cols, rows] = np.arange(rows.size)
        return position.reshape(-1)

    return _cached_index(like, (n, unpack), make)


def _on_device(xp, index: np.ndarray, device):
    """``index`` where ``xp.take`` reads it: on the device, except for JAX, which takes a
    NumPy index as a constant (a JAX array made inside ``jax.jit`` is that trace's
    value, and caching it would leak it into the next trace)."""
    if _xp.backend_name(xp) == "jax":
        return index
    return xp.asarray(index, device=device)


def _take_columns(xp, matrices, index):
    """``xp.take(matrices, index, axis=1)`` for non-negative indices: on PyTorch one
    ``index_select`` (array-api-compat's ``take`` adds three operations that wrap
    negative indices)."""
    if _xp.is_torch_namespace(xp):
        return matrices.index_select(1, index)
    return xp.take(matrices, index, axis=1)


def pack(matrices):
    """The upper triangles of a ``(k, n, n)`` stack as ``(k, n(n+1)/2)``.

    Examples
    --------
    >>> import numpy as np
    >>> pack(np.arange(4.0).reshape(1, 2, 2))
    array([[0., 1., 3.]])
    """
    xp = _xp.array_namespace(matrices)
    k, n = matrices.shape[0], matrices.shape[-1]
    index = _packing_index(matrices, n, unpack=False)
    return _take_columns(xp, xp.reshape(matrices, (k, n * n)), index)


def unpack(packed, n: int):
    """The symmetric ``(k, n, n)`` stack whose upper triangles :func:`pack` gave.

    Examples
    --------
    >>> import numpy as np
    >>> unpack(np.array([[0.0, 1.0, 3.0]]), 2)[0]
    array([[0., 1.],
           [1., 3.]])
    """
    xp = _xp.array_namespace(packed)
    index = _packing_index(packed, n, unpack=True)
    return xp.reshape(_take_columns(xp, packed, index), (packed.shape[0], n, n))


def diagonals(matrices, n: int):
    """The diagonals, shape ``(k, n)``, of a ``(k, n, n)`` stack or of a packed one.

    Examples
    --------
    >>> import numpy as np
    >>> diagonals(np.array([[0.0, 1.0, 3.0]]), 2)
    array([[0., 3.]])
    """
    xp = _xp.array_namespace(matrices)
    if matrices.ndim == 3:
        return xp.linalg.diagonal(matrices)

    def make():
        # Row i of the packed upper triangle starts after i rows of n, n−1, … entries.
        rows = np.arange(n)
        return rows * n - rows * (rows - 1) // 2

    return _take_columns(xp, matrices, _cached_index(matrices, (n, "diagonal"), make))
