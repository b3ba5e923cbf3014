"""Control flow that works eagerly, under ``jax.jit`` and under ``torch.compile``.

Loops whose exit depends on the data (a host check on eager backends,
``lax.while_loop`` under ``jax.jit``), branches, compile-time constants, the
caching of eager JAX programs, and the ordering of LAPACK calls inside a trace.
"""

from __future__ import annotations

import functools
import sys

import array_api_compat

from .namespace import array_namespace, is_jax_namespace, is_traced

__all__ = [
    "bounded_loop",
    "counted_loop",
    "trip_count",
    "cond",
    "host_constant",
    "outside_torch_compile",
    "jax_compiled",
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
