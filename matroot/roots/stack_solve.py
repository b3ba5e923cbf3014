"""One resolved call on a non-empty stack: regularise → scale → solve → unscale → judge.

Reads everything it needs from the :class:`~matroot.roots.call.RootCall`; every per-matrix
decision is batched on the device (no host read under ``jax.jit`` or
``torch.compile``; eagerly, only the finiteness test of the input).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .. import _xp
from .._typing import Array
from ..certify.accuracy import CHECK_RESOLUTION, is_converged, unit_roundoff
from .call import RootCall
from ..spectrum.lambda_max_bounds import FAILURE_PROBABILITY as BOUND_FAILURE_PROBABILITY
from ..spectrum.lambda_max_bounds import randomized_margin
from ..certify.probes import FAILURE_PROBABILITY as CHECK_FAILURE_PROBABILITY
from .result import InvRootResult
from ..spectrum.scaling import (RitzValues, certified_lambda_max, lambda_max_bound_core,
                      lambda_min_estimate_core, randomized_lambda_max, ritz_values)
from ..certify.verify import verify_root

__all__ = ["NONFINITE_INPUT", "solve_stack"]

NONFINITE_INPUT = ("a contains NaN or Inf (pass check_finite=False to get NaN roots for "
                   "those matrices instead)")


class _Regularised(NamedTuple):
    """The flat stack in the compute dtype, divided by ``magnitude`` (an exact power
    of two per matrix) and symmetrised; the ridge is added for an iterative method.
    ``narrowing``: per matrix, ``‖A − fl(A)‖_F/magnitude`` where the input was rounded
    to a narrower compute dtype (float64 input, ``compute_dtype="float32"``), else None."""

    stack: Array
    finite: Array
    magnitude: Array
    ridge: Array
    narrowing: Array | None = None


class _Scaled(NamedTuple):
    """The stack divided by its λmax bound ``scale`` (1 for a direct method);
    ``failure_probability``: per matrix, that the bound is below λmax (a
    randomized bound; 0 for a proven or guaranteed one)."""

    stack: Array
    scale: Array
    lambda_max: Array | None
    certify_cost: Array | None
    ritz: RitzValues | None
    failure_probability: float = 0.0


def solve_stack(a, *, call: RootCall, check_finite: bool, lambda_max_upper=None,
                lambda_min_lower=None, eager_program: bool = False):
    """The flat ``(b, ...)`` result of ``call`` on ``a``, which matrices were finite
    with a positive λmax bound (the others get NaN roots), a 0-d flag, True
    where some root lost its precision in the cast back to ``a.dtype``, and the
    largest ``u·κ/p`` above a caller's ``rtol`` among the matrices that did not
    converge (0-d; 0 where none: the ``rtol`` their dtype could not certify).
    ``eager_program``: traced as an eager call's compiled program (a direct solver
    then decides as it does eagerly)."""
    xp = _xp.array_namespace(a)
    solver, p = call.solver, call.p
    reg = _regularised(a, call, check_finite)
    b = reg.stack.shape[0]
    # A Lanczos run is needed only where a λmin estimate comes from the spectrum.
    needs_ritz = solver.needs_lower_bound and (solver.lower_from_spectrum or (
        not call.has_ridge and lambda_min_lower is None))
    sc = _scaled(reg, call, lambda_max_upper, needs_ritz)
    solver_kwargs: dict = dict(
        tol=call.tol, max_iter=call.max_iter, scaling=call.scaling,
        check_every=4 if _xp.is_accelerator(xp, a) else 1,
        matmul=_xp.Matmul(xp, None if call.matmul_dtype is None
                          else _xp.dtype_from_name(xp, call.matmul_dtype)))
    if not solver.needs_scaling and call.has_ridge:
        # A direct method adds the ridge itself, in the dtype it decomposes in (evd's
        # float64 eigh of a float32 stack gets the ridge in float64).
        solver_kwargs["ridge"] = reg.ridge
    if not solver.needs_scaling:
        solver_kwargs["eager_program"] = eager_program
    ritz = sc.ritz
    floor = reg.ridge if lambda_min_lower is None else xp.maximum(
        reg.ridge, _informative(_per_matrix(xp, lambda_min_lower, b, reg.stack.dtype,
                                            _xp.device_of(a))) / reg.magnitude)
    if solver.needs_lower_bound:
        solver_kwargs["lower"], ritz = _lower_bound(
            sc.stack, floor / sc.scale, ritz, has_ridge=call.has_ridge or lambda_min_lower
            is not None, from_spectrum=solver.lower_from_spectrum and (
                ritz is not None or lambda_min_lower is None))
    out = solver.solve(sc.stack, p, **solver_kwargs)
    lam_max = out.lambda_max if sc.lambda_max is None else sc.lambda_max
    certify_cost = xp.zeros_like(lam_max) if sc.certify_cost is None else sc.certify_cost

    # Without a Lanczos run (the caller gave the bounds) the check's κ comes from
    # them and from the root (matroot.certify.verify.kappa_from_root).
    kappa_bound = None
    if ritz is None and solver.needs_scaling:
        positive_floor = floor > 0
        kappa_bound = xp.where(positive_floor, sc.scale / xp.where(
            positive_floor, floor, xp.ones_like(floor)), xp.full_like(floor, float("inf")))
    check = out.check if out.check is not None else verify_root(
        sc.stack, out.root, p, unit_roundoff=call.unit_roundoff(xp), ritz=ritz,
        kappa_bound=kappa_bound, certificate=call.certificate)
    probed = out.check is None and isinstance(p, int) and call.certificate == "randomized"
    # Union bound: the check's estimate and the reported λmax bound each fail with
    # their own probability (a short λmax bound alone never makes a wrong root
    # converged: the check judges the root whatever scaled it).
    failure_probability = (CHECK_FAILURE_PROBABILITY if probed else 0.0) + sc.failure_probability
    # A caller's λmax bound that is NaN, ±inf or ≤ 0 leaves its matrix without a
    # scale: NaN root, converged=False (not an overflow of a root that was computed).
    usable = reg.finite & (lam_max > 0) & xp.isfinite(lam_max)
    # One pass: the unscaling factor is NaN for the matrices that get NaN roots.
    factor = _xp.inverse_root_entries(reg.magnitude, p)
    if solver.needs_scaling:
        factor = factor * _xp.inverse_root_entries(sc.scale, p)
    root = out.root * xp.where(usable, factor, xp.full_like(factor, float("nan")))[:, None, None]
    returned = xp.astype(root, a.dtype, copy=False)
    # The root the caller gets is what is judged: finite in the output dtype (an
    # unscaled root can overflow where the scaled one did not), and changed by the
    # cast by at most one unit roundoff of that dtype.
    fits = _xp.finite_matrices(returned)
    computed = usable & _xp.finite_matrices(root)
    cast_error, cast_ok = _cast_back_error(returned, root, computed)
    estimate = check.error_estimate
    if reg.narrowing is not None:
        # ‖A‖_F ≥ λmax caps a caller's loose λmax bound, which would shrink the term.
        top = xp.minimum(lam_max, _xp.frobenius_norm(reg.stack))
        estimate = estimate + _narrowing_error(reg.narrowing, top, check.kappa, p)
    error_estimate = xp.where(fits & computed, estimate + cast_error,
                              xp.full_like(cast_error, float("inf")))
    converged = is_converged(out.converged | (call.tol == 0),
                             usable & check.positive & fits & cast_ok,
                             estimate, call.accuracy(check.kappa, a.shape[-1]))
    lam_max = lam_max * reg.magnitude
    nan_b = xp.full_like(lam_max, float("nan"))
    residual = xp.where(usable, check.residual if isinstance(p, int) else out.residual,
                        nan_b)
    result = InvRootResult(
        root=returned,
        residual=residual,
        iterations=out.iterations,
        converged=converged,
        lambda_max=xp.where(reg.finite, lam_max, nan_b),
        matmuls=out.matmuls,
        method=call.method,
        error_estimate=xp.where(usable, error_estimate, nan_b),
        repaired=xp.zeros_like(converged),
        check_matmuls=certify_cost + check.matmul_equivalents,
        failure_probability=failure_probability,
    )
    overflow = usable & check.positive & ~(fits & cast_ok)
    floor = xp.zeros_like(lam_max)
    if call.rtol is not None:
        floor = CHECK_RESOLUTION * call.unit_roundoff(xp) * check.kappa / p
        floor = xp.where(usable & ~converged & (call.rtol < floor), floor, xp.zeros_like(floor))
    return result, usable, xp.any(overflow), xp.max(floor)


def _regularised(a, call: RootCall, check_finite: bool) -> _Regularised:
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    b = math.prod(a.shape[:-2])
    traced = _xp.is_traced(a)
    work_dtype = getattr(xp, call.work_dtype)
    stack = _xp.row_major(xp.reshape(xp.astype(a, work_dtype, copy=False), (b, n, n)))
    finite = _xp.finite_matrices(stack)
    # Traced (jax.jit, torch.compile) values cannot be read: non-finite matrices
    # come back NaN, and every matrix takes the select below.
    all_finite = False if traced else bool(xp.all(finite))
    # The input itself is read again only to tell its NaN/Inf from an overflowing cast.
    if check_finite and not traced and not all_finite and not bool(xp.all(xp.isfinite(a))):
        raise ValueError(NONFINITE_INPUT)
    # Non-finite matrices are swapped for I, so no NaN enters the shared loop.
    if not all_finite:
        eye = _xp.identity_stack(xp, n, work_dtype, _xp.device_of(a))
        stack = _xp.batched_where(finite, stack, eye)
    # An exact power-of-two scale first, so that symmetrising (×0.5) cannot round
    # subnormal entries away nor overflow huge ones; the ridge is part of it, so
    # eps / magnitude stays in range.
    magnitude = _xp.power_of_two_scale(stack, call.eps)
    stack = _xp.symmetric_part(stack / magnitude[:, None, None])
    # Tensor by tensor: torch divides a Python number by a tensor as number·(1/tensor),
    # and 1/magnitude overflows for a subnormal magnitude (0·inf = NaN).
    narrowed = unit_roundoff(xp, a.dtype) < unit_roundoff(xp, work_dtype)
    if narrowed:  # eps scaled in the input's dtype: in float32 a tiny one is subnormal
        wide = xp.astype(magnitude, a.dtype)
        ridge = xp.astype(xp.full_like(wide, call.eps) / wide, work_dtype)
    else:
        ridge = xp.full_like(magnitude, call.eps) / magnitude
    if call.has_ridge and call.solver.needs_scaling:
        stack = _xp.add_scaled_identity(stack, ridge)
    narrowing = None
    if narrowed:
        # The check sees only the rounded stack: what the rounding moved is measured
        # here, in the input's dtype (exactly: a − fl(a) is representable there).
        flat = xp.reshape(a, (b, n, n))
        moved = _xp.frobenius_norm(flat - xp.astype(xp.astype(flat, work_dtype), a.dtype))
        # Scaled before the cast: an input rounded to a subnormal moves by less than
        # the compute dtype's smallest number (float64 input near 1e-44, float32 compute).
        narrowing = xp.astype(moved / xp.astype(magnitude, a.dtype), work_dtype)
    return _Regularised(stack, finite, magnitude, ridge, narrowing)


def _narrowing_error(narrowing, lam_max, kappa, p):
    """The root's relative error from rounding the input to the compute dtype, to
    first order: a perturbation E moves ``A^(-1/p)`` by at most ``‖E‖_F/(p·λmin)``
    relative to its norm (divided differences of ``λ^(-1/p)`` are at most
    ``λmin^(-1/p-1)/p``), with λmin = λmax/κ. A float32 solve of float64 input at
    κ = 1e7 came back converged 0.1 off (evd, whose float64 retry of the rounded
    stack saw none of it); ∞ where λmax or κ is unusable, so not converged."""
    xp = _xp.array_namespace(narrowing)
    usable = (lam_max > 0) & xp.isfinite(lam_max) & xp.isfinite(kappa)
    safe = xp.where(usable, lam_max, xp.ones_like(lam_max))
    return xp.where(usable, narrowing * kappa / (p * safe), xp.full_like(safe, float("inf")))


def _scaled(reg: _Regularised, call: RootCall, lambda_max_upper, needs_ritz: bool) -> _Scaled:
    stack = reg.stack
    xp = _xp.array_namespace(stack)
    dev = _xp.device_of(stack)
    if not call.solver.needs_scaling:
        # A direct method (eigh) takes the spectrum as it is: no bound to certify.
        return _Scaled(stack, xp.ones(stack.shape[:1], dtype=stack.dtype, device=dev),
                       None, None, None)
    ritz = None
    failure = 0.0
    if lambda_max_upper is not None:
        # The caller's bound is used as given: nothing is spent to find one (no
        # Lanczos run unless the λmin estimate needs one). A bound below λmax
        # leaves the basin, which the check of the root catches.
        lam_max = _per_matrix(xp, lambda_max_upper, stack.shape[0], stack.dtype,
                              dev) / reg.magnitude
        certify_cost = xp.zeros_like(lam_max)
    elif call.scaling == "power" and call.bound_certificate == "cholesky" and not needs_ritz:
        # Nothing else needs a Lanczos run (no λmin estimate; the check's κ comes
        # from the root): a block power estimate, proven by the Cholesky test.
        certified = certified_lambda_max(stack)
        lam_max, certify_cost = certified.bound, certified.matmul_equivalents
    elif call.scaling == "power":
        # One Lanczos run serves the λmax bound, the λmin estimate and the check's κ
        # (Ritz values scale with the matrix).
        ritz = ritz_values(stack)
        if call.bound_certificate == "randomized":
            certified = randomized_lambda_max(stack, ritz=ritz)
            if randomized_margin(stack.shape[-1], ritz.steps) > 0:
                failure = BOUND_FAILURE_PROBABILITY
        else:
            top = ritz.high if _xp.is_traced(stack) else _xp.from_numpy(
                xp, ritz.high, dtype=stack.dtype, device=dev)
            certified = certified_lambda_max(stack, estimate=top)
        lam_max, certify_cost = certified.bound, certified.matmul_equivalents
    else:
        lam_max = lambda_max_bound_core(stack, scaling=call.scaling)
        certify_cost = xp.zeros_like(lam_max)
    scale = xp.where(lam_max > 0, lam_max, xp.ones_like(lam_max))
    return _Scaled(stack / scale[:, None, None], scale, lam_max, certify_cost,
                   None if ritz is None else ritz.divided(scale), failure)


def _per_matrix(xp, value, b, dtype, device):
    """A caller's scalar or batch-shaped bound as a flat ``(b,)`` array."""
    value = xp.asarray(value, dtype=dtype, device=device)
    return xp.reshape(xp.broadcast_to(value, (b,) if value.ndim == 0 else value.shape), (b,))


def _informative(lower):
    """A caller's per-matrix λmin bounds, NaN and ±Inf read as 0 (no information):
    such a matrix is solved as if no bound were given, its neighbours unchanged."""
    xp = _xp.array_namespace(lower)
    return xp.where(xp.isfinite(lower), lower, xp.zeros_like(lower))


def _cast_back_error(returned, root, computed):
    """Relative Frobenius change of each root by the cast to the output dtype, and
    whether it is at most one unit roundoff of that dtype (finite, within range)."""
    xp = _xp.array_namespace(root)
    if returned.dtype == root.dtype:
        zero = xp.zeros(root.shape[:1], dtype=root.dtype, device=_xp.device_of(root))
        return zero, _resolved(returned)
    safe = _xp.batched_where(computed, root, xp.ones_like(root))
    back = _xp.batched_where(computed, xp.astype(returned, root.dtype), safe)
    entry = xp.max(xp.abs(safe), axis=(-2, -1))
    entry = xp.where(entry > 0, entry, xp.ones_like(entry))[:, None, None]
    change = _xp.frobenius_norm((back - safe) / entry) / _xp.frobenius_norm(safe / entry)
    change = xp.where(xp.isfinite(change), change, xp.full_like(change, float("inf")))
    return change, (change <= unit_roundoff(xp, returned.dtype)) & _resolved(returned)


def _resolved(returned):
    """Per root: whether it keeps its relative precision in its dtype's range.

    An entry below the smallest normal number is rounded by up to half the smallest
    subnormal, ``u·tiny``; n² of them move the root by at most ``n·u·tiny`` in
    Frobenius norm, within one unit roundoff of it while its largest entry is at
    least ``n·tiny``. A root computed at a scale that underflows (evd's unscaling at
    p < 1, a huge input) fails this, even where no cast happened."""
    xp = _xp.array_namespace(returned)
    n = returned.shape[-1]
    if n == 0:
        return xp.ones(returned.shape[:1], dtype=xp.bool, device=_xp.device_of(returned))
    tiny = float(xp.finfo(returned.dtype).smallest_normal)
    return xp.max(xp.abs(returned), axis=(-2, -1)) >= n * tiny


def _lower_bound(scaled, eps_scaled, ritz, *, has_ridge: bool, from_spectrum: bool):
    """A lower bound on the scaled spectrum: the ridge or the caller's bound when
    there is one (a guarantee), else the Lanczos estimate (its Ritz value errs
    high, hence its safety factor).

    ``from_spectrum``: the Lanczos estimate, never below the ridge, even with one
    (chebyshev's degree grows with the interval, and a ridge far below the
    spectrum would push it to its cap; a bound that is too high is caught by the
    a-posteriori check). The stack solve passes False when the caller gave both
    bounds: then nothing is spent on a run. Under jax.jit / torch.compile the estimate is formed on
    the device, with no host read.

    ``ritz``: the call's :class:`~matroot.spectrum.scaling.RitzValues` of ``scaled``, or
    None (then a run is made here when needed). Returns ``(bound, ritz)``, the
    run passed on to the check, which reads its κ from it."""
    if has_ridge and not from_spectrum:
        return eps_scaled, ritz
    xp = _xp.array_namespace(scaled)
    if ritz is None:
        ritz = ritz_values(scaled)
    estimate = lambda_min_estimate_core(scaled, xp.ones_like(eps_scaled), ritz=ritz)
    return xp.maximum(estimate, eps_scaled), ritz
