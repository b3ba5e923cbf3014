"""What a call concludes from its roots' checks: the verdict read on the host or left on
the device, the fallback that re-solves the failed matrices, the cast warning.

:func:`matroot.inv_root_info` passes itself as ``solve`` (the fallback's solver), so
this module needs nothing above it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from .. import _xp
from . import stack_solve
from .call import RootCall, compiled_call
from .fixed_solve import fixed_solve, verdict_limit
from .result import ConvergenceWarning, reshaped

__all__ = ["repair", "repair_on_device", "solve_fixed", "warn_cast"]


def solve_fixed(a, xp, call: RootCall, batch, b: int, n: int, on_device: bool,
                check_finite: bool, solve: Callable):
    """A fixed-step solve (:mod:`matroot.roots.fixed_solve`) and its verdict: read on the
    host once (all converged?), a second time only where some matrix did not (why), or
    left on the device. ``solve`` is :func:`matroot.inv_root_info` (the fallback's).
    ``(None, None)`` where finite matrices were beyond the fixed path's range: the
    caller solves the call on the adaptive path instead."""
    if _xp.is_jax_namespace(xp) and not _xp.is_traced(a):
        parts = compiled_call(fixed_solve, a, call, on_device=on_device)
    else:
        parts = fixed_solve(a, call=call, on_device=on_device)
    if on_device:
        result = parts.result
        if call.fallback is not None:
            result = repair_on_device(xp.reshape(a, (b, n, n)), result, parts.usable(),
                                      call, solve)
        return reshaped(xp, result, batch), None
    # The verdict's one host read: the largest gate, below the limit where every matrix
    # converged (a NaN is not). Only where some did not does a second read say why
    # (non-finite input, a cast that failed).
    failed = 0
    everything = b == 0 or float(xp.max(parts.gate)) < verdict_limit(call)
    result = parts.decided(call, everything)
    if not everything:
        usable = parts.usable()
        stack = xp.reshape(a, (b, n, n))
        nonfinite, nonfinite_input, trouble, failed = (int(v) for v in _xp.to_numpy(xp.stack([
            xp.sum(xp.astype(m, xp.int32)) for m in (
                parts.nonfinite(), ~_xp.finite_matrices(stack), parts.cast_trouble(call),
                ~result.converged & usable)])))
        if check_finite and nonfinite_input:
            raise ValueError(stack_solve.NONFINITE_INPUT)
        if nonfinite > nonfinite_input:
            # Finite matrices the fixed path's power-of-two normalisation cannot hold
            # (every entry below the dtype's normal range): the adaptive path scales
            # them in two steps. Its result stands for the whole call.
            return None, None
        if trouble:
            warn_cast(a, call)
        if call.fallback is not None and failed:
            result = repair(xp.reshape(a, (b, n, n)), result, usable, call, solve)
    return reshaped(xp, result, batch), failed


def warn_cast(a, call: RootCall, stacklevel: int = 5) -> None:
    """The warning for roots that overflow or lose their precision in the output dtype."""
    warnings.warn(
        f"inv_root_info: some roots overflow or lose their precision in {a.dtype} "
        f"(computed in {call.work_dtype}, or in the cast back; entries beyond its "
        "range); they are converged=False. Pass a wider input dtype or a larger eps",
        ConvergenceWarning, stacklevel=stacklevel)


def repair_on_device(stack, result, usable, call: RootCall, solve: Callable):
    """The device verdict's fallback: the whole stack re-solved in float64, taken where a
    usable matrix failed its check (no host read decides which)."""
    xp = _xp.array_namespace(stack)
    fix = solve(stack, call.p, method=call.fallback, eps=call.eps, rtol=call.rtol,
                        compute_dtype="float64", check_finite=False, verdict="device")
    mask = ~result.converged & usable

    def merged(new, old):
        if new.ndim == 3:
            return _xp.batched_where(mask, xp.astype(new, old.dtype), old)
        return xp.where(mask, xp.astype(new, old.dtype), old)

    return _with_repairs(result, fix, merged, mask)


def repair(stack, result, usable, call: RootCall, solve: Callable):
    """Re-solve the matrices that failed their check with ``fallback`` in
    float64, held to the same accuracy target (``call.rtol``; None: the table)."""
    xp = _xp.array_namespace(stack)
    failed = _xp.to_numpy(~result.converged & usable)
    where = np.nonzero(failed)[0]
    if where.size == 0:
        return result
    index = _xp.from_numpy(xp, where, dtype=xp.int64, device=_xp.device_of(stack))
    fix = solve(xp.take(stack, index, axis=0), call.p, method=call.fallback,
                        eps=call.eps, rtol=call.rtol, compute_dtype="float64",
                        check_finite=False)
    position = np.zeros(failed.shape, dtype=np.int64)
    position[where] = np.arange(where.size)
    gather = _xp.from_numpy(xp, position, dtype=xp.int64, device=_xp.device_of(stack))
    mask = _xp.from_numpy(xp, failed, device=_xp.device_of(stack))

    def merged(new, old):
        taken = xp.take(new, gather, axis=0)
        if taken.ndim == 3:
            return _xp.batched_where(mask, taken, old)
        return xp.where(mask, xp.astype(taken, old.dtype), old)

    return _with_repairs(result, fix, merged, mask)


def _with_repairs(result, fix, merged: Callable, mask):
    """``result`` with the fields a fallback re-solve replaces taken from ``fix`` by
    ``merged(new, old)``, and ``repaired`` set to ``mask``."""
    return result._replace(
        root=merged(fix.root, result.root), residual=merged(fix.residual, result.residual),
        converged=merged(fix.converged, result.converged),
        error_estimate=merged(fix.error_estimate, result.error_estimate),
        lambda_max=merged(fix.lambda_max, result.lambda_max),
        check_matmuls=merged(fix.check_matmuls, result.check_matmuls),
        repaired=mask)
