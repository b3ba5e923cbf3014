"""Batched linear algebra on ``(b, n, n)`` stacks that the array API leaves out or
that one backend does in fewer operations its own way (torch's ``bmm``, ``baddbmm``
and ``add(..., alpha=)``, per-matrix Cholesky failures).

On a GPU a solver step's time is about the number of operations it dispatches
(each ~10 µs at n ≤ 512), so the helpers a solver loop calls every step map to one
backend operation where the backend has one, and never write into their inputs
(an in-place pass gave XLA a deadlock under ``jax.jit`` at optimisation level 0)."""

from __future__ import annotations

from .namespace import array_namespace, device_of, is_torch_namespace, is_traced
from .precision import has_float64
from .tracing import lapack_in_order

__all__ = [
    "identity_stack",
    "add_scaled_identity",
    "batched_matmul",
    "add_product",
    "add_product_over",
    "add_scaled",
    "shifted_product",
    "scaled_plus_identity",
    "batched_where",
    "frobenius_norm",
    "symmetric_part",
    "power_of_two_scale",
    "inverse_root_entries",
    "finite_matrices",
    "cholesky_succeeds",
    "spd_solve",
]


def identity_stack(xp, n: int, dtype, device):
    """An ``(n, n)`` identity that broadcasts against ``(b, n, n)`` stacks."""
    return xp.eye(n, dtype=dtype, device=device)


def add_scaled_identity(a, c):
    """Return ``a + c[..., None, None] * I`` for a stack ``a`` and per-matrix ``c``."""
    xp = array_namespace(a)
    n = a.shape[-1]
    eye = identity_stack(xp, n, a.dtype, device_of(a))
    return a + c[..., None, None] * eye


def _add_to_diagonal(a, c):
    """torch: ``a += c·I`` in place, ``c`` a number or a per-matrix (b, 1, 1) tensor."""
    a.diagonal(dim1=-2, dim2=-1).add_(float(c) if isinstance(c, (int, float)) else c[..., 0])
    return a


def _torch_batched(a, b) -> bool:
    """Whether torch's batched products take ``a`` and ``b`` as they are: 3-D stacks
    of one batch size and dtype (``a @ b`` would add expand/reshape operations)."""
    return (a.ndim == 3 and b.ndim == 3 and a.shape[0] == b.shape[0]
            and a.dtype == b.dtype)


def batched_matmul(a, b):
    """``a @ b`` for ``(b, n, n)`` stacks (or anything ``@`` takes): torch's ``bmm``
    where both are 3-D stacks of one batch size, one operation instead of six.

    Examples
    --------
    >>> import numpy as np
    >>> batched_matmul(np.eye(2)[None] * 2, np.ones((1, 2, 2)))
    array([[[2., 2.],
            [2., 2.]]])
    """
    xp = array_namespace(a)
    if is_torch_namespace(xp) and _torch_batched(a, b):
        import torch

        return torch.bmm(a, b)
    return a @ b


def add_product(base, a, b, *, beta: float = 1.0, alpha: float = 1.0):
    """Return ``beta * base + alpha * (a @ b)`` for ``(b, n, n)`` stacks ``a``, ``b``.

    ``base`` broadcasts against the product (an ``(n, n)`` identity, a stack);
    ``beta`` and ``alpha`` are Python numbers. torch forms it in one ``baddbmm``.

    Examples
    --------
    >>> import numpy as np
    >>> add_product(np.eye(2), np.ones((1, 2, 2)), np.ones((1, 2, 2)), beta=3.0, alpha=-0.5)
    array([[[ 2., -1.],
            [-1.,  2.]]])
    """
    xp = array_namespace(a)
    if is_torch_namespace(xp) and _torch_batched(a, b) and base.dtype == a.dtype:
        import torch

        return torch.baddbmm(base, a, b, beta=beta, alpha=alpha)
    product = a @ b
    if alpha != 1.0:
        product = alpha * product
    return (base if beta == 1.0 else beta * base) + product


def add_product_over(base, a, b, *, alpha: float = 1.0):
    """:func:`add_product` (``beta = 1``) for a ``base`` the caller discards: on torch
    the product is added into ``base`` itself (``baddbmm_``) where ``base`` needs no
    gradient, which spares the copy of ``base`` that ``baddbmm`` makes first (as
    long as the product's own pass). Elsewhere (and under ``torch.compile``) it is
    :func:`add_product`.

    Examples
    --------
    >>> import numpy as np
    >>> add_product_over(np.ones((1, 2, 2)), np.eye(2)[None], np.full((1, 2, 2), 2.0), alpha=0.5)
    array([[[2., 2.],
            [2., 2.]]])
    """
    xp = array_namespace(a)
    if (is_torch_namespace(xp) and _torch_batched(a, b) and base.dtype == a.dtype
            and tuple(base.shape) == (a.shape[0], a.shape[1], b.shape[2])
            and not base.requires_grad and not is_traced(base)):
        return base.baddbmm_(a, b, alpha=alpha)
    return add_product(base, a, b, alpha=alpha)


def add_scaled(x, alpha, y):
    """Return ``x + alpha * y``: one ``add`` on torch (``addcmul`` where ``alpha`` is
    an array that broadcasts against ``y``, e.g. per-matrix (b, 1, 1)); an integer
    ``x`` is promoted to ``y``'s dtype in the same operation.

    Examples
    --------
    >>> import numpy as np
    >>> add_scaled(np.ones(2), -0.25, np.array([4.0, 8.0]))
    array([ 0., -1.])
    """
    xp = array_namespace(y)
    if is_torch_namespace(xp) and (x.dtype == y.dtype or not x.dtype.is_floating_point):
        import torch

        if isinstance(alpha, (int, float)):
            return torch.add(x, y, alpha=alpha)
        if alpha.dtype == y.dtype == x.dtype:
            return torch.addcmul(x, alpha, y)
    return x + alpha * y


def shifted_product(c, alpha: float, a, b, eye):
    """Return ``c * I + alpha * (a @ b)`` for ``(b, n, n)`` stacks.

    ``c`` is a float or a per-matrix ``(b, 1, 1)`` array (the same arithmetic per
    matrix either way, up to rounding). One :func:`add_product` of the identity
    (``c·I`` is formed first where ``c`` is an array).
    """
    if isinstance(c, (int, float)):
        return add_product(eye, a, b, beta=float(c), alpha=alpha)
    return add_product(c * eye, a, b, alpha=alpha)


def scaled_plus_identity(a, c, shifts: tuple, eye, *, overwrite: bool = False):
    """Return ``c * a + (d₁ + d₂ + …) * I`` for a ``(b, n, n)`` stack.

    ``c`` and each shift ``dᵢ`` of ``shifts`` are floats or per-matrix
    ``(b, 1, 1)`` arrays. The shifts are added one after the other, each rounded
    to the stack's dtype, so a matrix's result does not depend on whether its
    coefficients came as floats (shared by the stack) or as array entries. With
    ``overwrite`` torch writes the result into ``a`` (which the caller must own:
    a temporary it no longer reads): one pass and no new stack, which on a CPU
    also saves the page faults of a fresh allocation.
    """
    xp = array_namespace(a)
    if overwrite and is_torch_namespace(xp):
        if not (isinstance(c, (int, float)) and c == 1):
            a.mul_(c)
        for d in shifts:
            _add_to_diagonal(a, d)
        return a
    out = a if isinstance(c, (int, float)) and c == 1 else c * a
    for d in shifts:
        out = out + d * eye
    return out


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
    half = a * 0.5  # one product, read twice: the transposed read is the slow one
    return half + xp.matrix_transpose(half)


def power_of_two_scale(a, floor: float = 0.0):
    """Per matrix of a ``(b, n, n)`` stack: a power of two near ``max(max|a_ij|, floor)``
    (1 for an all-zero matrix), so that dividing by it is exact and brings every
    entry near 1 (subnormal and huge entries alike)."""
    xp = array_namespace(a)
    m = xp.maximum(xp.max(a, axis=(-2, -1)), -xp.min(a, axis=(-2, -1)))
    m = xp.maximum(m, xp.full_like(m, floor))
    m = xp.where((m > 0) & xp.isfinite(m), m, xp.ones_like(m))
    # log2 of a subnormal is exact enough to give its exponent; 2**k is exact. Rounding
    # down keeps 2**k finite for entries above the largest power of two (it would
    # overflow to inf there) and every entry divided by it below 2.
    return 2.0 ** xp.floor(xp.log2(m))


def inverse_root_entries(x, p: float):
    """``x ** (-1/p)`` entry by entry, rounded the same wherever an entry sits in ``x``.

    torch on a CPU evaluates ``pow`` with SIMD code for whole vector widths and
    scalar code for the rest, which can differ in the last bit: a matrix's root
    would then depend on how many matrices share its batch (and a sharded run
    would not match one process). Division and square roots are correctly
    rounded on every path, so for p = 1, 2, 4, 8, … the power is a chain of them;
    other p take ``pow`` in float64 (where the backend has it), rounded once to
    ``x``'s dtype (float64 entries at such p can still differ in the last bit).

    Examples
    --------
    >>> import numpy as np
    >>> inverse_root_entries(np.array([16.0, 81.0]), 4)
    array([0.5       , 0.33333333])
    """
    xp = array_namespace(x)
    if p in (1, 2, 4, 8, 16, 32, 64):
        for _ in range(int(p).bit_length() - 1):
            x = xp.sqrt(x)
        return 1.0 / x
    if x.dtype == xp.float32 and has_float64(xp):
        return xp.astype(xp.astype(x, xp.float64) ** (-1.0 / p), x.dtype)
    return x ** (-1.0 / p)


def finite_matrices(a):
    """Per matrix of a stack: whether every entry is finite.

    ``0·x`` is 0 for finite x and NaN for ±Inf or NaN, so the sum is 0 exactly when
    all entries are finite; on torch CPU this is ~5× faster than ``isfinite``. Not
    while torch.compile traces: inductor folds ``x·0`` to 0, which would call every
    matrix finite.
    """
    xp = array_namespace(a)
    if is_torch_namespace(xp) and is_traced(a):
        return xp.all(xp.isfinite(a), axis=(-2, -1))
    return xp.sum(a * 0, axis=(-2, -1)) == 0


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
        factor = lapack_in_order(xp.linalg.cholesky, a)
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
    return lapack_in_order(xp.linalg.solve, a, rhs)
