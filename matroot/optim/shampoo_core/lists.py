"""Elementwise arithmetic over lists of arrays: one ``torch._foreach_*`` call per list
on PyTorch, a loop over the list on every other array library.

The step's elementwise half (moments, grafting directions, the final update, the
step counts) runs over one list per family of parameters, so that its cost in
operations (on a GPU, kernel launches) depends on how many lists there are, not on
how many parameters are in them. Every function here computes, entry by entry,
exactly what the plain expression in its docstring computes (the same operations in
the same order, so the same rounding); the functions ending in ``_`` overwrite their
first list (mutable arrays only), the others return new arrays.

An operand is one array (0-d: the same for every entry), a Python number, or a list
of either (one per entry). PyTorch's foreach kernels take one tensor, one number or
a list of numbers as the second operand in one launch; a list of 0-d tensors beside
arrays of other shapes is accepted too, though on a GPU it runs entry by entry.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from ... import _xp

__all__ = ["is_foreach", "add", "sub", "mul", "div", "neg", "sqrt", "pow_from", "add_", "mul_",
           "div_", "sub_", "copy_", "frobenius_norms", "constant", "finite_flag", "zero_unless"]


def is_foreach(xp) -> bool:
    """Whether ``xp`` runs list operations as one call (PyTorch's foreach kernels)."""
    return _xp.is_torch_namespace(xp)


def _pairs(arrays, other):
    """Each array with its operand; a 0-d array operand in the array's dtype (PyTorch
    never promotes an array to a 0-d operand's dtype, NumPy 2 and JAX would)."""
    if isinstance(other, (list, tuple)):
        if len(other) != len(arrays):
            raise ValueError(f"{len(other)} operands for {len(arrays)} arrays")
        pairs = zip(arrays, other)
    else:
        pairs = ((a, other) for a in arrays)
    return [(a, _in_dtype_of(a, b)) for a, b in pairs]


def _in_dtype_of(array, operand):
    dtype = getattr(operand, "dtype", None)
    if dtype is None or dtype == array.dtype or getattr(operand, "ndim", 1) != 0:
        return operand
    return _xp.array_namespace(operand).astype(operand, array.dtype)


def _torch_operand(name, other, count):
    """``other`` as a foreach kernel takes it: numbers as a list of floats; a 0-d tensor
    added or subtracted as a list of it (the single-tensor overloads of add and sub
    read it on the host, a sync, to scale it by ``alpha``)."""
    if isinstance(other, (list, tuple)) and other and isinstance(other[0], numbers.Number):
        return [float(o) for o in other]
    if name in ("add", "sub") and getattr(other, "ndim", None) == 0:
        return [other] * count
    return list(other) if isinstance(other, tuple) else other


def _binary(name, symbol):
    def op(xp, arrays: Sequence, other):
        arrays = list(arrays)
        if not arrays:
            return []
        if is_foreach(xp):
            import torch
            operand = _torch_operand(name, other, len(arrays))
            return list(getattr(torch, f"_foreach_{name}")(arrays, operand))
        return [symbol(a, b) for a, b in _pairs(arrays, other)]

    op.__name__ = name
    op.__doc__ = f"``[a {name} b for a, b in ...]``: one new array per entry."
    return op


def _inplace(name, symbol):
    def op(xp, arrays: Sequence, other):
        arrays = list(arrays)
        if not arrays:
            return []
        if is_foreach(xp):
            import torch
            getattr(torch, f"_foreach_{name}_")(arrays, _torch_operand(name, other, len(arrays)))
            return arrays
        # NumPy and CuPy write into the arrays; JAX's operators return new ones.
        return [symbol(a, b) for a, b in _pairs(arrays, other)]

    op.__name__ = name + "_"
    op.__doc__ = f"``a {name}= b`` for each entry, in the arrays themselves."
    return op


def _iadd(a, b):
    a += b
    return a


def _isub(a, b):
    a -= b
    return a


def _imul(a, b):
    a *= b
    return a


def _idiv(a, b):
    a /= b
    return a


add = _binary("add", lambda a, b: a + b)
sub = _binary("sub", lambda a, b: a - b)
mul = _binary("mul", lambda a, b: a * b)
div = _binary("div", lambda a, b: a / b)
add_ = _inplace("add", _iadd)
sub_ = _inplace("sub", _isub)
mul_ = _inplace("mul", _imul)
div_ = _inplace("div", _idiv)


def neg(xp, arrays: Sequence) -> list:
    """``[-a for a in arrays]``."""
    arrays = list(arrays)
    if arrays and is_foreach(xp):
        import torch
        return list(torch._foreach_neg(arrays))
    return [-a for a in arrays]


def sqrt(xp, arrays: Sequence) -> list:
    """``[xp.sqrt(a) for a in arrays]``."""
    arrays = list(arrays)
    if arrays and is_foreach(xp):
        import torch
        return list(torch._foreach_sqrt(arrays))
    return [xp.sqrt(a) for a in arrays]


def pow_from(xp, base: float, exponents: Sequence) -> list:
    """``[base ** e for e in exponents]`` for arrays ``e`` (0-d step counts)."""
    exponents = list(exponents)
    if exponents and is_foreach(xp):
        import torch
        return list(torch._foreach_pow(base, exponents))
    return [_xp.power_of_count(base, e) for e in exponents]


def copy_(xp, targets: Sequence, sources: Sequence) -> None:
    """``t[...] = s`` for each pair: one copy kernel for the whole list on PyTorch."""
    targets, sources = list(targets), list(sources)
    if not targets:
        return
    if is_foreach(xp):
        import torch
        torch._foreach_copy_(targets, sources)
        return
    for t, s in zip(targets, sources):
        t[...] = s


def frobenius_norms(xp, blocks, *, wide: bool = False):
    """The Frobenius norm of each entry of a ``(k, ...)`` stack in one reduction on
    PyTorch, where the squares of 32- and 16-bit blocks are summed in float64 (no
    overflow, no underflow to zero); in the blocks' dtype, or float64 with ``wide``.
    None where the caller must take the safe two-pass route
    (:func:`matroot.optim.shampoo_core.grafting.block_norms`)."""
    if not is_foreach(xp) or blocks.dtype == xp.float64:
        return None
    axes = tuple(range(1, blocks.ndim))
    import torch
    norms = torch.linalg.vector_norm(blocks, dim=axes, dtype=torch.float64)
    return norms if wide else norms.to(blocks.dtype)


_CONSTANTS: dict = {}


def constant(xp, value: float, like):
    """``value`` as a 0-d array of ``like``'s dtype and device, for selects: on PyTorch
    made once per value, dtype and device (a Python number there costs an operation
    per use), elsewhere ``value`` times ``ones_like``."""
    if not is_foreach(xp):
        return value * xp.ones_like(like)
    import torch
    # Not kept while traced (a traced value must not outlive its trace) or fake.
    return _xp.kept(_CONSTANTS, (value, like.dtype, like.device), 256,
                    lambda: torch.full((), value, dtype=like.dtype, device=like.device))


def finite_flag(xp, arrays: Sequence):
    """Whether every array is finite, as a 0-d boolean array: on PyTorch one foreach
    max-abs reduction (NaN and Inf reach the maximum, no finite value overflows it)
    and two small operations, whatever the number of arrays."""
    arrays = [a for a in arrays if math.prod(a.shape)]
    if not arrays:
        return xp.asarray(True)
    if is_foreach(xp):
        import torch
        maxima = list(torch._foreach_norm(arrays, float("inf")))
        if len({m.dtype for m in maxima}) > 1:
            maxima = [m.to(torch.float32) for m in maxima]
        # A maximum of absolute values is finite exactly when it is below inf (NaN
        # compares False): one comparison where isfinite takes four operations.
        return (torch.stack(maxima) < math.inf).all()
    return xp.all(xp.stack([xp.all(xp.isfinite(a)) for a in arrays]))


def zero_unless(xp, flag, arrays: Sequence) -> list:
    """``[xp.where(flag, a, 0) for a in arrays]`` for a 0-d boolean ``flag``: on
    PyTorch the arrays of each dtype laid end to end in one buffer and selected with
    one operation, the results views of that buffer."""
    arrays = list(arrays)
    if not arrays:
        return []
    if not is_foreach(xp):
        return [xp.where(flag, a, xp.zeros_like(a)) for a in arrays]
    import torch
    out: list = [None] * len(arrays)
    by_dtype: dict = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    for indices in by_dtype.values():
        flat = torch.cat([arrays[i].reshape(-1) for i in indices])
        flat = torch.where(flag, flat, constant(xp, 0.0, flat))
        start = 0
        for i in indices:
            size = arrays[i].numel()
            out[i] = flat[start:start + size].view(arrays[i].shape)
            start += size
    return out
