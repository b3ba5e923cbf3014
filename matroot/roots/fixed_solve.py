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
3. the plan's steps (:func:`~matroot.solvers.fixed_runs.run_fixed`), the root's host
   factors on their last product;
4. the root symmetrised and checked in products
   (:func:`~matroot.certify.product_check.product_check`), and unscaled by
   ``λmax_bound^(1/p)``;
5. the verdict on the call's target ``rtol`` (a fixed plan always has one):
   :func:`~matroot.certify.accuracy.rtol_margin` below
   :func:`~matroot.certify.accuracy.rtol_limit` (the test of
   :func:`~matroot.certify.accuracy.within_rtol`, which
   :meth:`~matroot.roots.call.RootCall.certifies` applies to such a target), where the
   check trusts the root.

It returns the result and what a host verdict reads (:class:`FixedParts`): the largest
of the gates (one per matrix and column of κ's power steps), which join the margin and
the trust test in one ``maximum``, so that the read is the verdict's only reduction;
the device verdict reads nothing.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .. import _xp
from .._typing import Array
from ..certify.accuracy import rtol_limit, rtol_margin, unit_roundoff
from ..certify.product_check import product_check
from ..solvers.fixed_runs import run_fixed
from ..spectrum.lambda_max_bounds import schatten_lambda_max
from .call import RootCall
from .result import InvRootResult

__all__ = ["FixedParts", "fixed_solve", "verdict_limit"]


class FixedParts(NamedTuple):
    """What :func:`fixed_solve` returns: the flat result; ``scale``, the bound each
    normalised matrix was divided by; ``trust``, below the verdict's limit
    (:func:`~matroot.certify.accuracy.rtol_limit`) where the check trusted the root
    (:class:`~matroot.certify.product_check.ProductCheck`); ``root_norm``, ``unscale``
    and ``cast_ok``, what says whether the root fits the output dtype (its Frobenius
    norm is ``root_norm · unscale``; where a cast happened, whether it kept the root's
    precision); ``gate``, below the limit exactly where the root converged (shape (b,)
    with the device verdict; (b, k) with the host's, whose largest column decides).

    With ``on_device=False`` the result's ``converged`` is None and its
    ``error_estimate`` not yet infinite where the root is untrusted: a host verdict reads
    the largest ``gate`` once, and :meth:`decided` completes the result (in no operation
    where every matrix converged); the masks below are read only where some did not."""

    result: InvRootResult
    scale: Array
    trust: Array
    root_norm: Array
    unscale: Array
    cast_ok: Array | None
    gate: Array

    def usable(self) -> Array:
        """The matrices that were finite and not all zero (the others get NaN roots): a
        finite, positive scale (the entries are at most 1 after the power of two, so
        only a NaN or Inf makes it non-finite)."""
        return (self.scale > 0) & (self.scale < math.inf)

    def nonfinite(self) -> Array:
        """The matrices that held a NaN or Inf."""
        return ~(self.scale < math.inf)

    def fits(self) -> Array:
        """Roots finite and resolved in the output dtype (:func:`_fits`)."""
        return _fits(self.root_norm * self.unscale, self.cast_ok, self.result.root.dtype,
                     self.result.root.shape[-1])

    def cast_trouble(self, call: RootCall) -> Array:
        """Roots that passed their check but overflow or lose their precision in the
        output dtype."""
        return self.usable() & (self.trust < verdict_limit(call)) & ~self.fits()

    def decided(self, call: RootCall, all_converged: bool) -> InvRootResult:
        """The host verdict's result: where ``all_converged`` (read from the largest
        ``gate``) ``converged`` is a constant and the estimates stand, else both are
        formed: ``max(gate) < limit`` per matrix, and an infinite estimate where the root
        is untrusted."""
        xp = _xp.array_namespace(self.gate)
        dev = _xp.device_of(self.gate)
        if all_converged:
            return self.result._replace(converged=_xp.constant_vector(
                xp, True, self.gate.shape[0], xp.bool, dev))
        limit = verdict_limit(call)
        estimate = self.result.error_estimate
        return self.result._replace(
            converged=xp.max(self.gate, axis=-1) < limit,
            error_estimate=xp.where(self.trust < limit, estimate,
                                    _xp.constant(xp, math.inf, estimate.dtype, dev)))


def verdict_limit(call: RootCall) -> float:
    """What a fixed-step verdict's gate must stay below: :func:`rtol_limit` of the call's
    target (a fixed plan always has one)."""
    if call.rtol is None:
        raise ValueError("a fixed-step solve needs rtol")
    return rtol_limit(call.rtol)


def _regularised(a, call: RootCall):
    """``(stack, inverse)``: ``2·sym(a)/m`` for ``m`` a power of two per matrix near its
    largest entry (exact, so no entry rounds; ``inverse = 1/m``; a matrix with a NaN or
    Inf keeps it), plus twice the ridge. The factor 2 of the symmetrisation is left
    in: the scale takes it."""
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    b = math.prod(a.shape[:-2])
    stack = xp.reshape(xp.astype(a, getattr(xp, call.work_dtype), copy=False), (b, n, n))
    stack = _xp.row_major(stack)
    largest = xp.linalg.vector_norm(stack, axis=(-2, -1), ord=math.inf)  # NaN propagates
    if call.has_ridge:
        largest = xp.maximum(largest, xp.full_like(largest, call.eps))
    inverse = _xp.power_of_two_inverse(largest)
    normalised = stack * inverse[:, None, None]
    stack = normalised + xp.matrix_transpose(normalised)
    if call.has_ridge:
        stack = _xp.add_scaled_identity(stack, (2 * call.eps) * inverse)
    return stack, inverse


def fixed_solve(a, *, call: RootCall, on_device: bool = True) -> FixedParts:
    """The flat ``(b, ...)`` result of ``call`` (which has a fixed plan) on ``a``, with
    what a host verdict reads (:class:`FixedParts`); ``on_device=False`` leaves
    ``converged`` to that read."""
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
    # The root of A/(m·scale) is sym(Z) = Z/2 + (Z/2)ᵀ: the run's last product takes the
    # half (and its own host factor).
    matrix, host_factor = run_fixed(call.method, scaled, p, plan, matmul, a_factor=0.5,
                                    out_factor=0.5)
    if host_factor != 1.0:  # a one-step run: no last product to take it
        matrix = matrix * host_factor
    root = matrix + xp.matrix_transpose(matrix)
    limit = verdict_limit(call)
    check = product_check(scaled, root, p, unit_roundoff=call.unit_roundoff(xp),
                          scaled_factor=0.5, limit=limit)
    # The root of A is root·(m·scale)^(-1/p), the factor formed from 1/m over the scale:
    # λmax = m·scale overflows for entries near the dtype's largest, where the root
    # does not.
    lambda_max = scale / inverse
    unscale = _xp.root_entries(inverse / scale, p)
    returned = xp.astype(root * unscale[:, None, None], a.dtype, copy=False)
    estimate, cast_ok = check.estimate, None
    infinity = _xp.constant(xp, math.inf, estimate.dtype, dev)
    if returned.dtype != root.dtype:
        cast_error, cast_ok = _cast_error(returned, root, unscale)
        estimate = estimate + cast_error
    if p < 2 or cast_ok is not None:
        # An inverse (p = 1) can leave the dtype's range, a cast any root. For p ≥ 2 in
        # the compute dtype a trusted root always fits: its norm is within a factor
        # √n·κ^(1/p) of λmax^(-1/p), which the dtype holds from its smallest subnormal
        # to √n times its largest entry (docs/launches.rst).
        estimate = xp.where(_fits(check.root_norm * unscale, cast_ok, a.dtype, n), estimate,
                            infinity)

    def margins(of):  # (b, k): the κ of each column of the check's power steps
        return rtol_margin(of[:, None], check.kappa_roots, p, call.unit_roundoff(xp),
                           kappa_power=check.kappa_power)

    if on_device:
        estimate = xp.where(check.trust < limit, estimate, infinity)
        gate = xp.max(margins(estimate), axis=-1)
        converged = gate < limit
    else:  # one maximum joins the tests, the host read's reduction the columns;
        # decided() forms the rest where a matrix failed
        gate = xp.maximum(margins(estimate), check.trust[:, None])
        converged = None
    result = InvRootResult(
        root=returned,
        residual=check.residual,
        iterations=_xp.constant_vector(xp, plan.total, b, xp.int32, dev),
        converged=converged,
        lambda_max=lambda_max,
        matmuls=_xp.constant_vector(xp, matmul.count, b, xp.int32, dev),
        method=call.method,
        error_estimate=estimate,
        repaired=_xp.constant_vector(xp, False, b, xp.bool, dev),
        check_matmuls=_xp.constant_vector(xp, 2 + check.matmul_equivalents, b, scale.dtype,
                                          dev),
    )
    return FixedParts(result, scale, check.trust, check.root_norm, unscale, cast_ok, gate)


def _fits(size, cast_ok, dtype, n: int) -> Array:
    """Roots finite and resolved in ``dtype``: their Frobenius norm ``size`` is (the
    entries are at most that norm and at least the norm / n), in one clip, and the
    cast, if any, kept their precision (``cast_ok``)."""
    xp = _xp.array_namespace(size)
    low, high = n * n * float(xp.finfo(dtype).smallest_normal), float(xp.finfo(dtype).max)
    # Limits the size's own dtype holds: torch refuses to clip a float32 size to a
    # float64 bound (float64 input computed in float32), where any positive finite
    # float32 fits (2^-149 is float32's smallest subnormal).
    computed = xp.finfo(size.dtype)
    low = max(low, float(computed.smallest_normal) * float(computed.eps))
    high = min(high, float(computed.max))
    fits = xp.clip(size, low, high) == size
    return fits if cast_ok is None else fits & cast_ok


def _cast_error(returned, root, unscale) -> tuple[Array, Array]:
    """Relative Frobenius change of each root by its cast to the output dtype, and
    whether it is at most one unit roundoff of that dtype."""
    xp = _xp.array_namespace(root)
    exact = root * unscale[:, None, None]
    change = _xp.frobenius_norm(xp.astype(returned, root.dtype) - exact) / \
        _xp.frobenius_norm(exact)
    return change, change <= unit_roundoff(xp, returned.dtype)
