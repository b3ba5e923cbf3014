"""Eigenbasis refresh: warm-started, certified eigenvectors of symmetric stacks.

The entry point :func:`refresh_eigenbasis` (:mod:`.refresh`) and its method,
orthogonal iteration (:mod:`.orthogonal_iteration`). SOAP and eigenvalue-corrected
Shampoo keep Adam's moments in the eigenbasis of Shampoo's factors and refresh it
every few steps from the last one (docs/eigenbasis.rst).
"""

from __future__ import annotations

from .refresh import (
    DEFAULT_ITERATIONS,
    DEFAULT_RTOL,
    EigenbasisResult,
    refresh_eigenbasis,
)

__all__ = ["refresh_eigenbasis", "EigenbasisResult", "DEFAULT_ITERATIONS", "DEFAULT_RTOL"]
