"""Array-namespace seam: the only module that knows which array library is in use.

Everything else in matroot receives ``xp`` (an array-API namespace) and calls the
helpers here for what the standard leaves out: identity stacks, host transfers,
device kinds, 16-bit rounding, the fused ``c*I + alpha*(a @ b)`` product that
torch can do in one kernel, and loops whose exit depends on the data (a host
check on eager backends, ``lax.while_loop`` under ``jax.jit``).
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import array_api_compat
from array_api_compat import (
    array_namespace,
    device as device_of,
    is_cupy_namespace,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
)

__all__ = [
    "array_namespace",
    "device_of",
    "is_torch_namespace",
    "is_cupy_namespace",
    "is_numpy_namespace",
    "is_jax_namespace",
    "backend_name",
    "is_traced",
    "has_float64",
    "bounded_loop",
    "counted_loop",
    "trip_count",
    "host_constant",
    "outside_torch_compile",
    "cond",
    "register_jax_pytree",
    "jax_compiled",
    "is_accelerator",
    "identity_stack",
    "add_scaled_identity",
    "shifted_product",
    "scaled_plus_identity",
    "to_numpy",
    "from_numpy",
    "dtype_from_name",
    "round_to",
    "batched_where",
    "frobenius_norm",
    "symmetric_part",
    "inverse_root_entries",
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
    if is_jax_namespace(xp):
        return "jax"
    if array_api_compat.is_array_api_strict_namespace(xp):
        return "array_api_strict"
    return getattr(xp, "__name__", "unknown")


def is_accelerator(xp, x) -> bool:
    """True when ``x`` lives on a device where a host sync is expensive."""
    if is_cupy_namespace(xp):
        return True
    if is_torch_namespace(xp):
        return x.device.type != "cpu"
    if is_jax_namespace(xp):
        import jax

        # A tracer has no device; jit places it on the default backend.
        devices = jax.devices() if is_traced(x) else x.devices()
        return any(d.platform != "cpu" for d in devices)
    return False


def is_traced(x) -> bool:
    """True where ``x``'s values cannot be read on the host (no ``bool()``/``float()``):
    a JAX tracer (inside ``jax.jit``, ``vmap``, ``grad``), or a torch tensor while
    ``torch.compile`` traces (a read would break the graph)."""
    if array_api_compat.is_jax_array(x):
        import jax

        return isinstance(x, jax.core.Tracer)
    if array_api_compat.is_torch_array(x):
        import torch

        return torch.compiler.is_compiling()
    return False


def has_float64(xp) -> bool:
    """Whether ``xp`` can hold float64 arrays (JAX only with ``jax_enable_x64``)."""
    if is_jax_namespace(xp):
        import jax

        return bool(jax.config.read("jax_enable_x64"))
    return True


def bounded_loop(body, carry, *, max_iter: int, running, check_every: int, traced: bool):
    """``carry = body(carry, k)`` for ``k = 0, 1, …`` until ``max_iter`` or none runs.

    ``running(carry)`` is a 0-d boolean array: whether any matrix still iterates.
    Eagerly the host reads it every ``check_every`` steps (the only syncs of the
    loop) and ``k`` is a Python int. Under ``torch.compile`` all ``max_iter``
    steps are traced (frozen matrices pass through unchanged), so a compiled
    graph holds no data-dependent exit: use a small ``max_iter``. Under
    ``jax.jit`` the loop is a ``lax.while_loop`` that checks on the device every
    step: ``k = 0`` runs first as plain Python (so a first step may differ in
    structure, e.g. start from the identity), later ``k`` are traced int32
    scalars. The carry must keep its shapes and dtypes from step to step.
    """
    if not traced or not is_jax_namespace(array_namespace(running(carry))):
        for k in range(max_iter):
            carry = body(carry, k)
            if not traced and (k + 1) % check_every == 0 and not bool(running(carry)):
                break
        return carry
    if max_iter < 1:
        return carry
    import jax.numpy as jnp
    from jax import lax

    carry = body(carry, 0)

    def keep_going(counted):
        k, inner = counted
        return (k < max_iter) & running(inner)

    def advance(counted):
        k, inner = counted
        return k + 1, body(inner, k)

    return lax.while_loop(keep_going, advance, (jnp.asarray(1, dtype=jnp.int32), carry))[1]


def identity_stack(xp, n: int, dtype, device):
    """An ``(n, n)`` identity that broadcasts against ``(b, n, n)`` stacks."""
    return xp.eye(n, dtype=dtype, device=device)


def power_of_two_scale(a, floor: float = 0.0):
    """Per matrix of a ``(b, n, n)`` stack: a power of two near ``max(max|a_ij|, floor)``
    (1 for an all-zero matrix), so that dividing by it is exact and brings every
    entry near 1 (subnormal and huge entries alike)."""
    xp = array_namespace(a)
    m = xp.maximum(xp.max(a, axis=(-2, -1)), -xp.min(a, axis=(-2, -1)))
    m = xp.maximum(m, xp.full_like(m, floor))
    m = xp.where((m > 0) & xp.isfinite(m), m, xp.ones_like(m))
    # log2 of a subnormal is exact enough to round to its exponent; 2**k is exact.
    return 2.0 ** xp.round(xp.log2(m))


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


def shifted_product(c, alpha: float, a, b, eye):
    """Return ``c * I + alpha * (a @ b)`` for ``(b, n, n)`` stacks.

    ``c`` is a float or a per-matrix ``(b, 1, 1)`` array (the same arithmetic per
    matrix either way, so a matrix's result does not depend on whether its
    neighbours share its ``c``). torch adds ``c`` to the product's diagonal in
    place (no pass over a ``c·I`` stack, no temporary); other backends use the
    generic expression. Both paths are compared in the tests.
    """
    xp = array_namespace(a)
    if is_torch_namespace(xp) and a.ndim == 3 and a.dtype == b.dtype:
        out = a @ b
        if alpha != 1.0:
            out.mul_(alpha)
        return _add_to_diagonal(out, c)
    return c * eye + alpha * (a @ b)


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


def host_constant(fn):
    """Mark ``fn`` (host arguments → NumPy constants) as a constant for ``torch.compile``.

    Dynamo then calls it once while tracing and bakes the result into the graph
    instead of tracing its NumPy code (this sets the marker that
    ``torch._dynamo.assume_constant_result`` sets, without importing torch).
    The result is cached: it depends on the arguments only.
    """
    results: dict = {}

    @functools.wraps(fn)
    def cached(*args):
        if args not in results:
            results[args] = fn(*args)
        return results[args]

    cached._dynamo_marked_constant = True
    return cached


def outside_torch_compile(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, run eagerly outside the graph when ``torch.compile``
    traces the caller (a graph break there), as a plain call otherwise.

    For work whose host reads are by design (a solver's convergence checks): the
    graph around it stays free of them. torch is looked up, not imported.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        return torch.compiler.disable(fn)(*args, **kwargs)
    return fn(*args, **kwargs)


@functools.lru_cache(maxsize=256)
def _jax_jit(fn, static_items: tuple):
    import jax

    return jax.jit(functools.partial(fn, **dict(static_items)))


def jax_compiled(fn, array, **static):
    """``fn(array, **static)`` as one ``jax.jit`` call, compiled once per ``static``
    (hashable values) and, by JAX, once per shape and dtype of ``array``.

    For eager JAX callers: JAX runs an uncompiled function one operation at a time,
    compiling each on its first use, which is slower on the first call and after it.
    """
    return _jax_jit(fn, tuple(sorted(static.items())))(array)


@functools.cache
def register_jax_pytree(cls, static_fields: tuple = ()):
    """Make a NamedTuple ``cls`` a JAX pytree (once), its ``static_fields`` (e.g. a
    method name) kept as auxiliary data, so ``jax.jit`` can return it."""
    import jax

    fields = tuple(cls._fields)
    arrays = tuple(f for f in fields if f not in static_fields)

    def flatten(value):
        return tuple(getattr(value, f) for f in arrays), tuple(
            getattr(value, f) for f in static_fields)

    def unflatten(static, children):
        return cls(**dict(zip(arrays, children)), **dict(zip(static_fields, static)))

    jax.tree_util.register_pytree_node(cls, flatten, unflatten)


def cond(predicate, if_true, if_false, *operands):
    """``if_true(*operands)`` where the 0-d boolean ``predicate`` holds, else
    ``if_false(*operands)``: a host branch eagerly, ``lax.cond`` under ``jax.jit``
    (both results must then have the same structure, shapes and dtypes)."""
    if is_traced(predicate) and array_api_compat.is_jax_array(predicate):
        from jax import lax

        return lax.cond(predicate, if_true, if_false, *operands)
    return if_true(*operands) if bool(predicate) else if_false(*operands)


def trip_count(count, upper: int):
    """What :func:`counted_loop` can run for a 0-d integer array ``count ≤ upper``:
    ``int(count)`` eagerly, ``count`` itself under ``jax.jit`` (a device-side
    bound), ``upper`` under ``torch.compile`` (the graph needs a static count)."""
    if not is_traced(count):
        return int(count)
    return count if array_api_compat.is_jax_array(count) else upper


def counted_loop(body, carry, count, *, roll_like=None):
    """``carry = body(carry, k)`` for ``k = 0 … count − 1``; ``count`` may be a
    traced JAX scalar (``lax.fori_loop``, a while loop for a traced bound).

    ``roll_like``: an array of the computation; where it is a JAX tracer the loop
    is one ``lax.fori_loop`` even for a Python ``count`` (``k`` then a traced
    scalar), since XLA compiles an unrolled loop's every step anew.
    """
    if is_traced(count) or (array_api_compat.is_jax_array(roll_like) and is_traced(roll_like)):
        from jax import lax

        return lax.fori_loop(0, count, lambda k, c: body(c, k), carry)
    for k in range(int(count)):
        carry = body(carry, k)
    return carry


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
    # A copy: torch would share the buffer of a (possibly cached, read-only) array.
    arr = np.ascontiguousarray(arr).copy()
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


def symmetric_part(a):
    """Return ``(a + aᵀ) / 2`` computed without overflow near the dtype's maximum."""
    xp = array_namespace(a)
    half = a * 0.5  # one product, read twice: the transposed read is the slow one
    return half + xp.matrix_transpose(half)


#: Under a JAX trace, the last LAPACK custom call's output: the next one's input is
#: made to depend on it. jaxlib can deadlock when independent batched Choleskys
#: (LAPACK custom calls) run at once on a 2-core CPU (issue 26); a data dependency
#: makes XLA run them one after another. A token of another trace (a finished one,
#: or a loop body's) is not used: that would leak a tracer.
_LAPACK_ORDER: list = []


def lapack_in_order(call, a):
    """``call(a)`` for a LAPACK-backed operation (Cholesky, eigh); under a JAX trace,
    after every earlier one of the same trace (see :data:`_LAPACK_ORDER`).

    Returns ``call(a)``'s result unchanged; eagerly and on other backends it is
    just ``call(a)``.
    """
    if not (array_api_compat.is_jax_array(a) and is_traced(a)):
        return call(a)
    import jax
    from jax._src import core as jax_core  # the current trace: no public API yet

    current = jax_core.trace_ctx.trace
    if _LAPACK_ORDER and getattr(_LAPACK_ORDER[0], "_trace", None) is current:
        a, _ = jax.lax.optimization_barrier((a, _LAPACK_ORDER[0]))
    result = call(a)
    leaves = jax.tree_util.tree_leaves(result)
    _LAPACK_ORDER[:] = [leaves[0]]
    return result


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
