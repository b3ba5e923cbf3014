"""Fewer launches per call: device constants made once and reused across calls (an
identity, a constant vector as a broadcast view), and entry-wise maps written in the
fewest operations (a power of two from ``frexp``, roots by square roots, ``x + v·y·z``
in one ``addcmul``, a sign test as a penalty that one comparison reads with its value).

On a GPU every operation a call dispatches is a kernel launch; a constant that is the
same on every call (the identity of a size, a result field that holds one value)
need not be launched again. Each is kept per backend, device, dtype and size, read
only, and never while a trace runs (a traced value must not outlive its trace).
"""

from __future__ import annotations

from .linalg import cholesky_succeeds, identity_stack
from .namespace import (array_namespace, backend_name, device_of, fake_mode_active,
                        is_torch_namespace, is_traced)
from .precision import has_float64

__all__ = ["add_product_of", "constant", "constant_vector", "failure_penalty", "kept",
           "power_of_two_inverse", "root_entries", "shared_identity"]


def kept(cache: dict, key, limit: int, make):
    """``cache[key]``, made by ``make()`` on a miss and kept (the oldest entry dropped
    once ``limit`` are kept) unless it is traced: a traced value must not outlive its
    trace. ``key`` holds strings for backend, device and dtype (not every backend's
    device object is hashable). Nothing is kept or reused while a FakeTensorMode is
    active (:func:`fake_mode_active`)."""
    if fake_mode_active():
        return make()
    if key in cache:
        return cache[key]
    value = make()
    if is_traced(value):
        return value
    if len(cache) >= limit:
        del cache[next(iter(cache))]
    cache[key] = value
    return value


#: 0-d constants kept on their devices for :func:`constant_vector`.
_CONSTANTS: dict = {}


def constant(xp, value, dtype, device):
    """A 0-d array of ``value``, made once per value, dtype and device (an operand such as
    ``where``'s that would otherwise be a launch of its own on every call)."""
    return kept(_CONSTANTS, (backend_name(xp), str(device), str(dtype), value), 256,
                lambda: xp.full((), value, dtype=dtype, device=device))


def constant_vector(xp, value, length: int, dtype, device):
    """A length-``length`` vector of ``value``: a broadcast view of :func:`constant` (no
    launch on a GPU). Read-only (NumPy marks it so; torch refuses in-place writes to
    it), like a result field should be."""
    return xp.broadcast_to(constant(xp, value, dtype, device), (length,))


#: Identities kept on their devices for :func:`shared_identity`, keyed by (backend,
#: device, dtype, n) as strings; oldest dropped first.
_IDENTITIES: dict = {}
_IDENTITIES_KEPT = 16


def shared_identity(xp, n: int, dtype, device):
    """:func:`identity_stack`, made once per size, dtype and device and then reused (one
    launch saved per use on a GPU). Read-only: callers never write into it."""
    return kept(_IDENTITIES, (backend_name(xp), str(device), str(dtype), n), _IDENTITIES_KEPT,
                lambda: identity_stack(xp, n, dtype, device))


def power_of_two_inverse(m):
    """Per entry of ``m > 0``, ``2^(−e)`` with ``2^(e−1) ≤ m < 2^e`` (so ``m·2^(−e)`` lies in
    [1/2, 1), exactly): one ``frexp`` and one power where the backend has ``frexp``.
    In ``m``'s dtype (NumPy: float64), so ``inf`` where ``2^(−e)`` is beyond that
    dtype's range (``m`` below about its smallest normal number). For 0, ``inf`` and
    NaN the result is unspecified (1 from ``frexp``).

    Examples
    --------
    >>> import numpy as np
    >>> power_of_two_inverse(np.array([3.0, 0.5, 1e-3])).tolist()
    [0.25, 1.0, 512.0]
    """
    xp = array_namespace(m)
    frexp = getattr(xp, "frexp", None)
    if frexp is None:  # array-api-strict
        return 0.5 ** (xp.floor(xp.log2(m)) + 1)
    _, exponent = frexp(m)
    # The base in m's dtype: torch raises a Python number to a tensor's power in its
    # default dtype (float32), whose range holds neither float64's powers of two nor
    # the inverses of float32's subnormal numbers.
    return constant(xp, 0.5, m.dtype, device_of(m)) ** exponent


def root_entries(x, p: float):
    """``x ** (1/p)`` entry by entry, rounded the same wherever an entry sits in ``x``
    (square roots for p = 1, 2, 4, …; as :func:`inverse_root_entries` otherwise).

    Examples
    --------
    >>> import numpy as np
    >>> root_entries(np.array([16.0, 81.0]), 4)
    array([2., 3.])
    """
    xp = array_namespace(x)
    if p in (1, 2, 4, 8, 16, 32, 64):
        for _ in range(int(p).bit_length() - 1):
            x = xp.sqrt(x)
        return x
    if x.dtype == xp.float32 and has_float64(xp):
        return xp.astype(xp.astype(x, xp.float64) ** (1.0 / p), x.dtype)
    return x ** (1.0 / p)


def add_product_of(x, value: float, y, z):
    """``x + value·y·z`` entry by entry (``value`` a Python number): one ``addcmul`` on
    torch, where the plain expression is three operations.

    Examples
    --------
    >>> import numpy as np
    >>> add_product_of(np.array([1.0, 2.0]), 0.5, np.array([2.0, 4.0]), np.array([3.0, 1.0]))
    array([4., 4.])
    """
    xp = array_namespace(y)
    if is_torch_namespace(xp) and x.dtype == y.dtype == z.dtype:
        import torch

        return torch.addcmul(x, y, z, value=value)
    return x + value * (y * z)


def failure_penalty(a, *, definite: bool):
    """Per matrix of a ``(b, n, n)`` stack: 0 where it passes its sign test, a number
    ≥ 1 or NaN where it fails. The test is Cholesky success with ``definite`` (a
    symmetric stack), finiteness without. Added to a non-negative value that a
    threshold below 1 decides, it folds that test into the same comparison: one
    operation on torch (``cholesky_ex``'s integer ``info``, promoted by the sum).

    Examples
    --------
    >>> import numpy as np
    >>> a = np.stack([np.eye(2), -np.eye(2), np.full((2, 2), np.inf)])
    >>> failure_penalty(a, definite=True).tolist()
    [0.0, 1.0, 1.0]
    >>> np.isnan(failure_penalty(a, definite=False)).tolist()
    [False, False, True]
    """
    xp = array_namespace(a)
    if not definite:
        if is_torch_namespace(xp) and is_traced(a):  # see finite_matrices
            return xp.astype(~xp.all(xp.isfinite(a), axis=(-2, -1)), a.dtype)
        return xp.sum(a * 0, axis=(-2, -1))  # 0, or NaN for a NaN or Inf entry
    if is_torch_namespace(xp):
        import torch

        return torch.linalg.cholesky_ex(a).info
    return xp.astype(~cholesky_succeeds(a), a.dtype)
