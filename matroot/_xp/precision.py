"""Dtypes per backend: which exist, which precision a backend's eigh really uses,
and rounding to a narrower dtype."""

from __future__ import annotations

import contextlib

import array_api_compat
import numpy as np

from .namespace import (
    array_namespace,
    backend_name,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
    is_traced,
)

__all__ = [
    "has_float64",
    "dtype_from_name",
    "round_to",
    "eigh_runs_in_float64",
    "full_float32_products",
    "quiet_numpy_float_errors",
    "solve_context",
    "unit_roundoff",
    "work_dtype_name",
]


def has_float64(xp) -> bool:
    """Whether ``xp`` can hold float64 arrays (JAX only with ``jax_enable_x64``)."""
    if is_jax_namespace(xp):
        import jax

        return bool(jax.config.read("jax_enable_x64"))
    return True


def dtype_from_name(xp, name: str):
    """Look up ``xp.<name>``; raise ValueError when the backend lacks that dtype."""
    if name == "bfloat16" and is_torch_namespace(xp):
        import torch

        return torch.bfloat16
    dtype = getattr(xp, name, None)
    if dtype is None:
        raise ValueError(
            f"matmul_dtype={name!r} is not available in the {backend_name(xp)} backend"
        )
    return dtype


def round_to(x, dtype):
    """Round ``x`` to ``dtype`` and come back to x's dtype (operand rounding)."""
    xp = array_namespace(x)
    return xp.astype(xp.astype(x, dtype), x.dtype)


def eigh_runs_in_float64(xp) -> bool:
    """True when ``xp.linalg.eigh`` of float32 input computes in float64 (NumPy's
    LAPACK wrappers do, and array-api-strict wraps NumPy), so its float32 results
    are float64-accurate eigenpairs rounded to float32."""
    return is_numpy_namespace(xp) or array_api_compat.is_array_api_strict_namespace(xp)


@contextlib.contextmanager
def full_float32_products(xp, x):
    """Within the block, torch forms float32 products in float32 (its ``"highest"``
    matmul precision) even where the caller allowed TensorFloat32 or bfloat16 ones
    (``torch.set_float32_matmul_precision("high")``, common in training scripts):
    the accuracy table and the check's rounding allowance are float32's. The
    caller's setting is restored after. Nothing changes for other backends, nor
    under tracing, where a graph keeps the precision it was traced with. (The
    setting is process-wide: a thread running float32 products at the same time
    gets float32 ones too.)

    Examples
    --------
    >>> import numpy as np
    >>> with full_float32_products(np, np.eye(2)):
    ...     pass
    """
    if not is_torch_namespace(xp) or is_traced(x):
        yield
        return
    import torch

    before = torch.get_float32_matmul_precision()
    if before == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def quiet_numpy_float_errors(xp):
    """Within the block NumPy neither warns about nor raises on floating-point
    overflow, underflow, division by zero or invalid operations, whatever the
    caller's ``np.seterr``. A solve meets them by design (a diverging iterate of a
    singular or indefinite matrix, a NaN matrix under ``check_finite=False``) and
    reports them itself (``converged=False``, a ``ConvergenceWarning`` from
    :func:`~matroot.inv_root`); NumPy's own messages from inside it would only be
    noise, and under ``np.seterr(all="raise")`` a crash. Only for NumPy and
    array-api-strict (which computes with NumPy) namespaces ``xp``: the other
    backends never see the setting, and torch.compile cannot trace it.

    Examples
    --------
    >>> import numpy as np
    >>> with np.errstate(all="raise"), quiet_numpy_float_errors(np):
    ...     float(np.float32(3e38) * np.float32(10))
    inf
    """
    if backend_name(xp) not in ("numpy", "array_api_strict"):
        yield
        return
    with np.errstate(all="ignore"):
        yield


@contextlib.contextmanager
def solve_context(xp, x):
    """What every solve runs within (inv_root's and polar's alike):
    :func:`full_float32_products` and :func:`quiet_numpy_float_errors`.

    Examples
    --------
    >>> import numpy as np
    >>> with solve_context(np, np.eye(2)):
    ...     pass
    """
    with full_float32_products(xp, x), quiet_numpy_float_errors(xp):
        yield

def work_dtype_name(xp, dtype) -> str:
    """The dtype matroot computes in for input of ``dtype``: float64 for float64, float32
    for everything else (16-bit input is solved in float32 and returned in its dtype).

    The one statement of that rule, for every solve and every optimizer state.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot._xp import work_dtype_name
    >>> work_dtype_name(np, np.float64), work_dtype_name(np, np.float16)
    ('float64', 'float32')
    """
    return "float64" if dtype == xp.float64 else "float32"


def unit_roundoff(xp, dtype) -> float:
    """``u = eps/2`` of a floating ``dtype`` of the array namespace ``xp``.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot._xp import unit_roundoff
    >>> unit_roundoff(np, np.float32) == 2.0 ** -24
    True
    """
    return float(xp.finfo(dtype).eps) / 2
