"""Batched matmul under a precision policy: plain, or 16-bit operands accumulated in float32."""

from __future__ import annotations

from .linalg import add_product, batched_matmul
from .namespace import is_torch_namespace
from .precision import round_to

__all__ = [
    "Matmul",
    "matrix_power",
    "power_matmuls",
]


class Matmul:
    """Batched matmul under a precision policy.

    With ``operand_dtype=None`` this is plain ``a @ b`` (one ``bmm`` on torch). With
    a 16-bit dtype both operands are rounded to it and the product is accumulated
    and returned in the iterate's (float32) dtype, which is what tensor-core GEMMs
    with float32 accumulation compute. On CUDA torch the 16-bit GEMM itself runs.

    ``count`` records how many products were formed, for the diagnostics.
    """

    def __init__(self, xp, operand_dtype=None):
        self.xp = xp
        self.operand_dtype = operand_dtype
        self.count = 0

    def __call__(self, a, b):
        self.count += 1
        if self.operand_dtype is None:
            return batched_matmul(a, b)
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
        return batched_matmul(a, b)

    def shifted(self, c, alpha: float, a, b, eye, *, full: bool = False):
        """``c * I + alpha * (a @ b)`` under this policy (``full``: as :meth:`full`);
        ``c`` a float or a per-matrix ``(b, 1, 1)`` array."""
        if isinstance(c, (int, float)):
            return self.added(eye, a, b, beta=float(c), alpha=alpha, full=full)
        return self.added(c * eye, a, b, alpha=alpha, full=full)

    def added(self, base, a, b, *, beta: float = 1.0, alpha: float = 1.0,
              full: bool = False):
        """``beta * base + alpha * (a @ b)`` under this policy (``full``: as :meth:`full`)."""
        if self.operand_dtype is None or full:
            self.count += 1
            return add_product(base, a, b, beta=beta, alpha=alpha)
        return beta * base + alpha * self(a, b)

def matrix_power(x, p: int, matmul):
    """``x^p`` for integer ``p ≥ 1`` by binary powering (about log2(p) matmuls)."""
    result = None
    base = x
    while True:
        if p & 1:
            result = base if result is None else matmul(result, base)
        p >>= 1
        if not p:
            return result
        base = matmul(base, base)


def power_matmuls(p: int) -> int:
    """Matmuls :func:`matrix_power` forms for exponent ``p``: a squaring per binary
    digit after the first, a product per further one-digit.

    Integer arithmetic only: torch.compile's tracer in torch 2.11 breaks the graph at
    ``bin()``, and the graph break made it fail on an H200 (torch 2.13's traces it).
    """
    squarings, ones = -1, 0
    while p:
        squarings, ones, p = squarings + 1, ones + (p & 1), p >> 1
    return squarings + ones - 1
