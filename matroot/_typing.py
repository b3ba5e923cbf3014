"""Type aliases for the public API."""

from __future__ import annotations

from typing import Any

#: An array of any supported array-API library (NumPy, CuPy, PyTorch, JAX,
#: array-api-strict); they share no common base class to name.
Array = Any
