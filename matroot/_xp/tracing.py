"""Control flow that works eagerly, under ``jax.jit`` and under ``torch.compile``.

Loops whose exit depends on the data (a host check on eager backends,
``lax.while_loop`` under ``jax.jit``), branches, compile-time constants, the
caching of eager JAX programs, and JAX's CPU LAPACK calls kept off jaxlib's thread pool.
"""

from __future__ import annotations

import functools
import sys

import array_api_compat

from .namespace import array_namespace, is_accelerator, is_jax_namespace, is_traced

__all__ = [
    "bounded_loop",
    "counted_loop",
    "trip_count",
    "cond",
    "host_constant",
    "outside_torch_compile",
    "within_torch_compile",
    "jax_compiled",
    "one_program",
    "power_of_count",
    "register_jax_pytree",
    "lapack_in_order",
]


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


def trip_count(count, upper: int):
    """What :func:`counted_loop` can run for a 0-d integer array ``count ≤ upper``:
    ``int(count)`` eagerly, ``count`` itself under ``jax.jit`` (a device-side
    bound), ``upper`` under ``torch.compile`` (the graph needs a static count)."""
    if not is_traced(count):
        return int(count)
    return count if array_api_compat.is_jax_array(count) else upper


def cond(predicate, if_true, if_false, *operands):
    """``if_true(*operands)`` where the 0-d boolean ``predicate`` holds, else
    ``if_false(*operands)``: a host branch eagerly, ``lax.cond`` under ``jax.jit``
    (both results must then have the same structure, shapes and dtypes)."""
    if is_traced(predicate) and array_api_compat.is_jax_array(predicate):
        from jax import lax

        return lax.cond(predicate, if_true, if_false, *operands)
    return if_true(*operands) if bool(predicate) else if_false(*operands)


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


def within_torch_compile() -> bool:
    """Whether ``torch.compile`` traces the caller, or the caller runs inside a compiled
    function's extent without being traced (Dynamo ran it as Python after a graph break
    and compiles the frames it calls one by one, so their Python numbers can still
    become symbols). False in plain eager code; torch is looked up, not imported.

    Examples
    --------
    >>> from matroot._xp.tracing import within_torch_compile
    >>> within_torch_compile()
    False
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if torch.compiler.is_compiling():
        return True
    # The one private seam: Dynamo's frame callback is set only inside a compiled region.
    callback = getattr(torch._C._dynamo.eval_frame, "get_eval_frame_callback", None)
    return callback is not None and callback() not in (None, False)


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


def jax_compiled(fn, array, dynamic: dict | None = None, **static):
    """``fn(array, **dynamic, **static)`` as one ``jax.jit`` call, compiled once per
    ``static`` (hashable values) and, by JAX, once per shape and dtype of ``array``
    and of the ``dynamic`` keyword values (arrays, numbers or None: traced, so an
    array is accepted and a new number is no new compilation).

    For eager JAX callers: JAX runs an uncompiled function one operation at a time,
    compiling each on its first use, which is slower on the first call and after it.
    """
    return _jax_jit(fn, tuple(sorted(static.items())))(array, **(dynamic or {}))


def one_program(fn, array, dynamic: dict | None = None, **static):
    """``fn(array, **dynamic, **static)``: as one compiled program
    (:func:`jax_compiled`) where ``array`` is a JAX array, else a plain call.

    For a public entry point whose body is a few dozen small operations: eagerly, JAX
    compiles each of them for its shapes on first use (seconds per new shape). Traced
    too: under an eager ``jax.vmap`` a loop's program was traced and compiled again at
    every call, and under ``jax.jit`` the cached trace is reused.
    """
    if array_api_compat.is_jax_array(array):
        return jax_compiled(fn, array, dynamic, **static)
    return fn(array, **(dynamic or {}), **static)


def power_of_count(base: float, count):
    """``base ** count`` for a number ``base`` and a count (a Python int or a 0-d
    integer array: a step count).

    Eager JAX turns a concrete integer exponent into a program of its own for each
    value (``lax.integer_pow``, compiled on first use): an eager training loop compiled
    one a step. ``lax.pow`` takes the count as data, as ``jax.jit`` does (so eager and
    compiled steps round alike).
    """
    # A Python count never reaches the JAX check: torch.compile would guard on its value
    # there (a recompile at every step of a compiled torch step).
    if (not isinstance(count, int) and array_api_compat.is_jax_array(count)
            and not is_traced(count)):
        import jax

        return jax.lax.pow(base, count)
    return base ** count


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


#: jaxlib 0.10's CPU LAPACK kernels (Cholesky, eigh, SVD, LU, triangular solve) run a
#: batch whose estimated work reaches this many flops as chunks on XLA's intra-op thread
#: pool, and the calling thread blocks until they finish. XLA runs a program's independent
#: operations on that same pool, so as many such calls at once as the pool has threads (two
#: on a 2-core machine) hold every thread while waiting for chunks no thread is left to
#: run: the process hangs at 0 % CPU (issue 36; jax-ml/jax#36927, later open-source builds
#: compile the chunking out). Below it, a call runs on its own thread and waits for nothing.
#: An ``optimization_barrier`` between the calls does not order them: XLA removes the
#: barriers before it schedules the program.
JAXLIB_POOL_FLOPS = 200_000


def _jaxlib_pools_lapack_batches() -> bool:
    """True where a CPU LAPACK call of this jaxlib can split its batch onto the pool."""
    import jaxlib

    version = tuple(int(part) for part in jaxlib.__version__.split(".")[:2] if part.isdigit())
    return version >= (0, 10)


def lapack_in_order(call, a, *more):
    """``call(a, *more)`` for a LAPACK-backed operation (Cholesky, eigh, SVD, solve)
    on ``(..., m, n)`` stacks (``more``: arrays with the same leading batch axes).

    Traced by JAX for a CPU, the stack goes through ``jax.lax.map`` in chunks whose
    work stays below :data:`JAXLIB_POOL_FLOPS` (the estimate of the costliest
    kernel, an SVD's ``10·m·n·min(m, n)``, for every kernel), so no call waits on
    jaxlib's thread pool and calls that XLA runs at once cannot deadlock. The
    result is ``call(a, *more)``'s, matrix by matrix. Eagerly each JAX operation is
    a program of its own whose one call runs on the dispatching thread, which can
    wait on the pool without holding one of its threads: there, on other backends
    and devices, and for a stack already small enough, it is just ``call(a, *more)``.
    """
    if not (array_api_compat.is_jax_array(a) and is_traced(a)) or a.ndim < 3:
        return call(a, *more)
    if is_accelerator(array_namespace(a), a) or not _jaxlib_pools_lapack_batches():
        return call(a, *more)
    rows, cols = a.shape[-2:]
    batch_shape = a.shape[:-2]
    batch = 1
    for size in batch_shape:
        batch *= size
    chunk = max(1, (JAXLIB_POOL_FLOPS - 1) // max(1, 10 * rows * cols * min(rows, cols)))
    if chunk >= batch:
        return call(a, *more)
    import jax

    flat = [x.reshape((batch, *x.shape[len(batch_shape):])) for x in (a, *more)]
    result = jax.lax.map(lambda args: call(*args), tuple(flat),
                         batch_size=chunk if chunk > 1 else None)
    return jax.tree_util.tree_map(lambda x: x.reshape((*batch_shape, *x.shape[1:])), result)
