"""One stack by the fixed-step rule: scale → a planned number of steps → check → verdict,
in a few dozen batched operations and no host read.

The call chose the plan on the host (:class:`~matroot.roots.call.RootCall` ``.fixed``,
:mod:`matroot.solvers.fixed_steps`), so nothing here depends on a value of the stack:

1. the stack in the compute dtype, divided by a power of two per matrix (exact) and
   symmetrised; the ridge on the diagonal; no finiteness read: a non-finite matrix
   stays non-finite through every batched product (none mixes matrices) and comes
   back NaN with ``converged=False``;
2. scaled by its Schatten-8 bound (:func:`~matroot.spectrum.lambda_max_bounds.schatten_lambda_max`,
   two products), whose overestimate the plan allowed for;
3. the plan's steps (:func:`~matroot.solvers.fixed_runs.run_fixed`);
4. the root symmetrised and checked in products
   (:func:`~matroot.certify.product_check.product_check`);
5. the verdict (:meth:`~matroot.roots.call.RootCall.certifies`), with the call's accuracy
   (a target ``rtol``: :func:`~matroot.certify.accuracy.rtol_allowance`).

It returns the result and the per-matrix masks a host verdict reads
(:class:`FixedParts`); the device verdict reads nothing.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .. import _xp
from .._typing import Array
from ..certify.accuracy import unit_roundoff
from ..certify.product_check import product_check
from ..solvers.fixed_runs import run_fixed
from ..spectrum.lambda_max_bounds import schatten_lambda_max
from .call import RootCall
from .result import InvRootResult

__all__ = ["FixedParts", "fixed_solve"]


class FixedParts(NamedTuple):
    """What :func:`fixed_solve` returns: the flat result; ``scale``, the bound each
    normalised matrix was divided by; ``checked``, where the check trusted the root;
    ``fits``, where it fits the output dtype. A host verdict reads the masks below
    only where some matrix did not converge."""

    result: InvRootResult
    scale: Array
    checked: Array
    fits: Array

    def usable(self) -> Array:
        """The matrices that were finite and not all zero (the others get NaN roots): a
        finite, positive scale (the entries are at most 1 after the power of two, so
        only a NaN or Inf makes it non-finite)."""
        return (self.scale > 0) & (self.scale < math.inf)

    def nonfinite(self) -> Array:
        """The matrices that held a NaN or Inf."""
        return ~(self.scale < math.inf)

    def cast_trouble(self) -> Array:
        """Roots that passed their check but overflow or lose their precision in the
        output dtype."""
        return self.usable() & self.checked & ~self.fits


def _regularised(a, call: RootCall):
    """``(stack, inverse)``: ``2·sym(a)/m`` for ``m`` a power of two per matrix near its
    largest entry (exact, so no entry rounds; ``inverse = 1/m``; a matrix with a NaN or
    Inf keeps it), plus twice the ridge. The factor 2 of the symmetrisation is left
    in: the scale takes it."""
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    b = math.prod(a.shape[:-2])
    stack = xp.reshape(xp.astype(a, getattr(xp, call.work_dtype), copy=False), (b, n, n))
    largest = xp.linalg.vector_norm(stack, axis=(-2, -1), ord=math.inf)  # NaN propagates
    if call.eps > 0:
        largest = xp.maximum(largest, xp.full_like(largest, call.eps))
    inverse = _xp.power_of_two_inverse(largest)
    normalised = stack * inverse[:, None, None]
    stack = normalised + xp.matrix_transpose(normalised)
    if call.eps > 0:
        stack = _xp.add_scaled_identity(stack, (2 * call.eps) * inverse)
    return stack, inverse


def fixed_solve(a, *, call: RootCall) -> FixedParts:
    """The flat ``(b, ...)`` result of ``call`` (which has a fixed plan) on ``a``, with
    what a host verdict reads where some matrix failed (:class:`FixedParts`)."""
    xp = _xp.array_namespace(a)
    p, plan = call.p, call.fixed
    if plan is None or not isinstance(p, int):
        raise ValueError("fixed_solve needs a call with a fixed plan and an integer p")
    dev = _xp.device_of(a)
    stack, inverse = _regularised(a, call)  # 2·A/m
    b, n = stack.shape[0], stack.shape[-1]
    # The bound of λmax(A/m) (half that of the stack); the solve takes A/(m·scale) as
    # half the stack divided by it, the half a host factor of every product.
    scale = schatten_lambda_max(stack, times=0.5)
    scaled = stack / scale[:, None, None]
    matmul = _xp.Matmul(xp)
    matrix, host_factor = run_fixed(call.method, scaled, p, plan, matmul, a_factor=0.5)
    # X = sym(Z) = (Z + Zᵀ)·host_factor/2 is checked as that multiple of Z + Zᵀ.
    doubled = matrix + xp.matrix_transpose(matrix)
    factor = 0.5 * host_factor
    check = product_check(scaled, doubled, p, unit_roundoff=call.unit_roundoff(xp),
                          factor=factor, scaled_factor=0.5)
    # The root of A is X·(m·scale)^(-1/p) = doubled·(inverse/scale)^(1/p)·factor.
    unscale = _xp.root_entries(inverse / scale * factor ** p, p)
    returned = xp.astype(doubled * unscale[:, None, None], a.dtype, copy=False)
    # The returned root is finite and resolved in its dtype when its Frobenius norm
    # is (its entries are at most that norm and at least the norm / n): one clip.
    size = check.root_norm * unscale
    tiny = float(xp.finfo(a.dtype).smallest_normal)
    fits = xp.clip(size, n * n * tiny, float(xp.finfo(a.dtype).max)) == size
    estimate = check.error_estimate
    if returned.dtype != doubled.dtype:
        cast_error, cast_ok = _cast_error(returned, doubled, unscale)
        fits = fits & cast_ok
        estimate = estimate + cast_error
    # fits implies a finite, positive unscaling (a usable matrix). An untrusted root's
    # estimate is inf, which no accuracy meets.
    estimate = xp.where(check.positive & fits, estimate,
                        _xp.constant(xp, math.inf, estimate.dtype, dev))
    result = InvRootResult(
        root=returned,
        residual=check.residual,
        iterations=_xp.constant_vector(xp, plan.total, b, xp.int32, dev),
        converged=call.certifies(estimate, check.kappa, n),
        lambda_max=scale / inverse,
        matmuls=_xp.constant_vector(xp, matmul.count, b, xp.int32, dev),
        method=call.method,
        error_estimate=estimate,
        repaired=_xp.constant_vector(xp, False, b, xp.bool, dev),
        check_matmuls=_xp.constant_vector(xp, 2 + check.matmul_equivalents, b, scale.dtype,
                                          dev),
    )
    return FixedParts(result, scale, check.positive, fits)


def _cast_error(returned, doubled, unscale) -> tuple[Array, Array]:
    """Relative Frobenius change of each root by its cast to the output dtype, and
    whether it is at most one unit roundoff of that dtype."""
    xp = _xp.array_namespace(doubled)
    exact = doubled * unscale[:, None, None]
    change = _xp.frobenius_norm(xp.astype(returned, doubled.dtype) - exact) / \
        _xp.frobenius_norm(exact)
    return change, change <= unit_roundoff(xp, returned.dtype)
