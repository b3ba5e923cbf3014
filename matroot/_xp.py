"""Array-namespace seam: the only module that knows which array library is in use.

Everything else in matroot receives ``xp`` (an array-API namespace) and calls the
helpers here for what the standard leaves out: identity stacks, host transfers,
device kinds, 16-bit rounding and the fused ``c*I + alpha*(a @ b)`` product that
torch can do in one kernel.
"""

from __future__ import annotations

import numpy as np
import array_api_compat
from array_api_compat import (
    array_namespace,
    device as device_of,
    is_cupy_namespace,
    is_numpy_namespace,
    is_torch_namespace,
)

__all__ = [
    "array_namespace",
    "device_of",
    "is_torch_namespace",
    "is_cupy_namespace",
    "is_numpy_namespace",
    "backend_name",
    "is_accelerator",
    "identity_stack",
    "add_scaled_identity",
    "shifted_product",
    "to_numpy",
    "from_numpy",
    "dtype_from_name",
    "round_to",
    "batched_where",
    "frobenius_norm",
    "symmetric_part",
    "cholesky_succeeds",
    "finite_matrices",
    "eigh_runs_in_float64",
    "Matmul",
]


def backend_name(xp) -> str:
    """Short name of the array library behind ``xp`` ("numpy", "torch", ...)."""
    if is_numpy_namespace(xp):
        return "numpy"
    if is_torch_namespace(xp):
        return "torch"
    if is_cupy_namespace(xp):
        return "cupy"
    if array_api_compat.is_array_api_strict_namespace(xp):
        return "array_api_strict"
    return getattr(xp, "__name__", "unknown")


def is_accelerator(xp, x) -> bool:
    """True when ``x`` lives on a device where a host sync is expensive."""
    if is_cupy_namespace(xp):
        return True
    if is_torch_namespace(xp):
        return x.device.type != "cpu"
    return False


def identity_stack(xp, n: int, dtype, device):
    """An ``(n, n)`` identity that broadcasts against ``(b, n, n)`` stacks."""
    return xp.eye(n, dtype=dtype, device=device)


def add_scaled_identity(a, c):
    """Return ``a + c[..., None, None] * I`` for a stack ``a`` and per-matrix ``c``."""
    xp = array_namespace(a)
    n = a.shape[-1]
    eye = identity_stack(xp, n, a.dtype, device_of(a))
    return a + c[..., None, None] * eye


def shifted_product(c, alpha: float, a, b, eye):
    """Return ``c * I + alpha * (a @ b)`` for ``(b, n, n)`` stacks.

    ``c`` is a float or a per-matrix ``(b, 1, 1)`` array (the same arithmetic per
    matrix either way, so a matrix's result does not depend on whether its
    neighbours share its ``c``). torch fuses this into one ``baddbmm`` call; other
    backends use the generic expression. Both paths are compared in the tests.
    """
    xp = array_namespace(a)
    if is_torch_namespace(xp) and a.ndim == 3 and a.dtype == b.dtype:
        import torch

        base = (c * eye).expand(a.shape[0], -1, -1)
        return torch.baddbmm(base, a, b, beta=1.0, alpha=alpha)
    return c * eye + alpha * (a @ b)


def to_numpy(x) -> np.ndarray:
    """Copy an array of any supported backend to a host NumPy array."""
    xp = array_namespace(x)
    if is_numpy_namespace(xp):
        return np.asarray(x)
    if is_torch_namespace(xp):
        return x.detach().cpu().numpy()
    if is_cupy_namespace(xp):
        return x.get()
    return np.from_dlpack(x)


def from_numpy(xp, arr: np.ndarray, *, dtype=None, device=None):
    """Move a host NumPy array into namespace ``xp`` on ``device``."""
    arr = np.ascontiguousarray(arr)
    if not arr.flags.writeable:
        # torch warns on read-only NumPy memory (cached coefficient tables are).
        arr = arr.copy()
    if dtype is None:
        return xp.asarray(arr, device=device)
    return xp.astype(xp.asarray(arr, device=device), dtype)


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


def batched_where(mask, new, old):
    """Per-matrix select: ``new[i]`` where ``mask[i]`` else ``old[i]``."""
    xp = array_namespace(new)
    return xp.where(mask[:, None, None], new, old)


def frobenius_norm(a):
    """Frobenius norm over the last two axes; the caller keeps entries O(1).

    One pass (``vector_norm``), not the three of ``sqrt(sum(a * a))``.
    """
    xp = array_namespace(a)
    return xp.linalg.vector_norm(a, axis=(-2, -1))


def symmetric_part(a):
    """Return ``(a + aᵀ) / 2`` computed without overflow near the dtype's maximum."""
    xp = array_namespace(a)
    return a / 2 + xp.matrix_transpose(a) / 2


def cholesky_succeeds(a):
    """Per matrix of a ``(b, n, n)`` symmetric stack: does its Cholesky factorisation succeed?

    torch reports failures per matrix (``cholesky_ex``); JAX and CuPy return NaN
    factors; NumPy and array-api-strict raise for the whole stack, so on a raise
    the matrices are retried one by one (failures are rare: a certificate that
    failed, or a wrong-branch root).
    """
    xp = array_namespace(a)
    if is_torch_namespace(xp):
        import torch

        return torch.linalg.cholesky_ex(a).info == 0
    try:
        factor = xp.linalg.cholesky(a)
    except Exception:  # LinAlgError differs per backend
        if a.shape[0] == 1:
            return xp.zeros((1,), dtype=xp.bool, device=device_of(a))
        return xp.concat([cholesky_succeeds(a[i:i + 1, ...]) for i in range(a.shape[0])])
    return xp.all(xp.isfinite(factor), axis=(-2, -1))


def spd_solve(a, rhs):
    """``a⁻¹·rhs`` for a ``(b, n, n)`` symmetric positive definite stack, ``rhs`` (b, n, k).

    torch solves by Cholesky (half an LU's work), reporting failures per matrix:
    those come back NaN. Elsewhere ``linalg.solve``, which may raise for the
    whole stack on a singular matrix.
    """
    xp = array_namespace(a)
    if is_torch_namespace(xp):
        import torch

        factor, info = torch.linalg.cholesky_ex(a)
        solved = torch.cholesky_solve(rhs, factor)
        return torch.where((info == 0)[:, None, None], solved, float("nan"))
    return xp.linalg.solve(a, rhs)


def finite_matrices(a):
    """Per matrix of a stack: whether every entry is finite.

    ``0·x`` is 0 for finite x and NaN for ±Inf or NaN, so the sum is 0 exactly when
    all entries are finite; on torch CPU this is ~5× faster than ``isfinite``.
    """
    xp = array_namespace(a)
    return xp.sum(a * 0, axis=(-2, -1)) == 0


def eigh_runs_in_float64(xp) -> bool:
    """True when ``xp.linalg.eigh`` of float32 input computes in float64 (NumPy's
    LAPACK wrappers do, and array-api-strict wraps NumPy), so its float32 results
    are float64-accurate eigenpairs rounded to float32."""
    return is_numpy_namespace(xp) or array_api_compat.is_array_api_strict_namespace(xp)


class Matmul:
    """Batched matmul under a precision policy.

    With ``operand_dtype=None`` this is plain ``a @ b``. With a 16-bit dtype both
    operands are rounded to it and the product is accumulated and returned in the
    iterate's (float32) dtype, which is what tensor-core GEMMs with float32
    accumulation compute. On CUDA torch the 16-bit GEMM itself runs.

    ``count`` records how many products were formed, for the diagnostics.
    """

    def __init__(self, xp, operand_dtype=None):
        self.xp = xp
        self.operand_dtype = operand_dtype
        self.count = 0

    def __call__(self, a, b):
        self.count += 1
        if self.operand_dtype is None:
            return a @ b
        xp = self.xp
        if is_torch_namespace(xp) and a.device.type == "cuda":
            return (a.to(self.operand_dtype) @ b.to(self.operand_dtype)).to(a.dtype)
        return round_to(a, self.operand_dtype) @ round_to(b, self.operand_dtype)

    def full(self, a, b):
        """``a @ b`` in the iterates' dtype whatever the policy (counted too).

        For products whose operands have a large norm or that finish an
        iteration, where 16-bit operand rounding costs more than it saves.
        """
        self.count += 1
        return a @ b

    def shifted(self, c, alpha: float, a, b, eye, *, full: bool = False):
        """``c * I + alpha * (a @ b)`` under this policy (``full``: as :meth:`full`)."""
        if self.operand_dtype is None or full:
            self.count += 1
            return shifted_product(c, alpha, a, b, eye)
        return c * eye + alpha * self(a, b)
