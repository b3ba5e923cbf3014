"""The public entry points: validate → regularise → scale → solve → unscale → report."""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Any, NamedTuple

import numpy as np

from . import _xp
from ._checks import (
    COMPUTE_DTYPES,
    FALLBACKS,
    SCALINGS,
    check_choice,
    check_matmul_dtype,
    check_bound,
    check_max_iter,
    check_nonnegative,
    check_p,
    check_stack,
)
from .scaling import (certified_lambda_max, lambda_max_bound_core, lambda_min_estimate_core,
                      ritz_values)
from .solvers import get_solver
from .solvers.auto import choose_method
from .solvers.registry import check_method, require_dtypes, require_support
from ._typing import Array
from .accuracy import check_rtol, is_converged, unit_roundoff
from .probes import FAILURE_PROBABILITY
from .verify import CERTIFICATES, accuracy_target, check_root

__all__ = ["inv_root", "inv_root_info", "InvRootResult", "ConvergenceWarning",
           "default_tol", "default_max_iter", "usable_roots"]


class ConvergenceWarning(RuntimeWarning):
    """Some matrices of a stack did not reach ``tol`` or came back non-finite."""


class InvRootResult(NamedTuple):
    """Result of :func:`inv_root_info`.

    Attributes
    ----------
    root : array, shape (..., n, n)
        ``(A + eps·I)^(-1/p)`` in the input's namespace, device and dtype.
    residual : array, shape (...)
        The true residual of the returned root, ``‖X^p·(A + eps·I) − I‖_F/√n``
        (scale-free, computed from X in the compute dtype; see
        :mod:`matroot.verify`). For evd, which checks its root from its
        eigenvalues and forms no products, the relative negative-eigenvalue
        deficit of A + eps·I.
    iterations : array, shape (...)
        Steps taken per matrix (polynomial degree for chebyshev, 0 for evd).
    converged : array of bool, shape (...)
        True where the method stopped on ``tol`` (or its rounding floor), the
        root is finite in the output dtype, positive definite, and its
        ``error_estimate`` is within ``rtol`` when given, else within
        ``max(tol, target)``, the README accuracy table's target for its
        estimated κ (:func:`matroot.verify.accuracy_target`).
    lambda_max : array, shape (...)
        The certified upper bound on λmax of ``A + eps·I`` used to scale it.
    matmuls : array, shape (...)
        n×n matrix products the solver spent on each matrix (0 for evd).
    method : str
        The solver that ran (what ``"auto"`` resolved to).
    error_estimate : array, shape (...)
        Estimated relative forward error ``‖X̃ − X‖_F/‖X‖_F`` of the returned
        root (derivation in :mod:`matroot.verify`; measured within 0.7–6× of
        the float64-oracle error; evd's from its eigenvalues,
        :func:`matroot.solvers.evd.eigh_root_check`), plus the rounding of the cast back to the
        input dtype; ``inf`` for a root that is not positive definite.
    repaired : array of bool, shape (...)
        Matrices whose check failed and that ``fallback`` re-solved.
    check_matmuls : array, shape (...)
        Cost of certifying λmax and checking the root, in n×n matmul
        equivalents (a Cholesky counts 1/6, a matrix-vector product 1/n).
    failure_probability : float
        Probability, per matrix, that ``error_estimate`` is too low because the
        check drew unlucky probes: :data:`matroot.probes.FAILURE_PROBABILITY`
        (1e-12) for ``certificate="randomized"``, 0 for a deterministic check.
    """

    root: Array
    residual: Array
    iterations: Array
    converged: Array
    lambda_max: Array
    matmuls: Array
    method: str
    error_estimate: Array
    repaired: Array
    check_matmuls: Array
    failure_probability: float = 0.0

    def __repr__(self) -> str:
        """One line: the root's dtype and shape, how many converged, the worst residual.

        Examples
        --------
        >>> import numpy as np, matroot
        >>> matroot.inv_root_info(np.stack([np.eye(3)] * 2), 2, method="evd")
        InvRootResult(method='evd', root=float64[2, 3, 3], converged 2/2, ...)
        """
        converged = _xp.to_numpy(self.converged)
        iterations = _xp.to_numpy(self.iterations)
        residual = _xp.to_numpy(self.residual).astype(float)
        if iterations.size == 0:
            steps = "-"
        elif iterations.min() == iterations.max():
            steps = f"{iterations.min()}"
        else:
            steps = f"{iterations.min()}-{iterations.max()}"
        shape = ", ".join(str(d) for d in self.root.shape)
        return (f"InvRootResult(method={self.method!r}, "
                f"root={str(self.root.dtype).rsplit('.', 1)[-1]}[{shape}], "
                f"converged {int(converged.sum())}/{converged.size}, iterations {steps}, "
                f"worst residual {float(np.nanmax(residual)) if residual.size else 0:.2g})")


#: The check of a root when ``certificate`` is not given (measured in
#: ``tests/test_randomized_check.py``).
DEFAULT_CERTIFICATE = "deterministic"

_NONFINITE_INPUT = ("a contains NaN or Inf (pass check_finite=False to get NaN roots for "
                    "those matrices instead)")


def default_tol(method: str, compute_dtype: str) -> float:
    """The ``tol`` that ``method`` uses when none is given, for float32 or float64.

    Parameters
    ----------
    method : str
        A registered solver name (not ``"auto"``), e.g. ``"minimax"``.
    compute_dtype : {"float32", "float64"}
        The dtype the solver computes in.

    Returns
    -------
    float

    Examples
    --------
    >>> import matroot
    >>> matroot.default_tol("newton_db", "float32")
    1e-05
    """
    spec = get_solver(method)
    check_choice(compute_dtype, "compute_dtype", spec.compute_dtypes)
    return spec.default_tol[compute_dtype]


def default_max_iter(method: str) -> int:
    """The iteration cap (degree cap for chebyshev) used when none is given.

    Parameters
    ----------
    method : str
        A registered solver name (not ``"auto"``), e.g. ``"minimax"``.

    Returns
    -------
    int

    Examples
    --------
    >>> import matroot
    >>> matroot.default_max_iter("coupled_newton")
    60
    """
    return get_solver(method).default_max_iter


def _with_signature_of(source):
    """Show ``source``'s parameters for the decorated ``f(a, /, p, **options)`` (in
    ``help()``, ``inspect`` and Sphinx), so both are declared and validated once."""
    def decorate(func):
        own = inspect.signature(func)
        func.__signature__ = inspect.signature(source).replace(
            return_annotation=own.return_annotation)
        return func

    return decorate


def inv_root_info(a: Array, /, p: float, *, method: str = "auto", eps: float = 0.0,
                  scaling: str = "power", tol: float | None = None,
                  rtol: float | None = None, max_iter: int | None = None,
                  matmul_dtype: str | None = None,
                  check_finite: bool = True, compute_dtype: str | None = None,
                  fallback: str | None = None, lambda_max_upper: Any = None,
                  lambda_min_lower: Any = None,
                  certificate: str = DEFAULT_CERTIFICATE) -> InvRootResult:
    """:func:`inv_root` with per-matrix diagnostics.

    Takes the same arguments as :func:`inv_root`.

    Returns
    -------
    InvRootResult
        ``root`` plus per-matrix ``residual``, ``iterations``, ``converged``,
        ``lambda_max`` and ``matmuls`` arrays of shape ``a.shape[:-2]``, and the
        ``method`` that ran.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.stack([np.diag([1.0, 4.0]), np.diag([9.0, 9.0])])
    >>> res = matroot.inv_root_info(a, 2, method="coupled_newton")
    >>> res.converged.tolist(), res.iterations.shape
    ([True, True], (2,))
    """
    xp = check_stack(a)
    if _xp.is_jax_namespace(xp):
        _xp.register_jax_pytree(InvRootResult, ("method", "failure_probability"))
    check_method(method)
    p = check_p(p)
    require_support(method, p)
    eps = check_nonnegative(eps, "eps")
    check_choice(scaling, "scaling", SCALINGS)
    check_choice(compute_dtype, "compute_dtype", COMPUTE_DTYPES)
    check_choice(fallback, "fallback", FALLBACKS)
    check_choice(certificate, "certificate", CERTIFICATES)
    max_iter = check_max_iter(max_iter)
    if tol is not None:
        tol = check_nonnegative(tol, "tol")
    if compute_dtype == "float64" and not _xp.has_float64(xp):
        raise ValueError("compute_dtype='float64' needs JAX's float64: enable it with "
                         "jax.config.update('jax_enable_x64', True) (or JAX_ENABLE_X64=1)")
    work_name = compute_dtype or ("float64" if a.dtype == xp.float64 else "float32")
    matmul_dtype = check_matmul_dtype(xp, matmul_dtype, work_name)
    if method == "auto":
        method = choose_method(xp, a, p, matmul_dtype=matmul_dtype)
    spec = get_solver(method)
    if compute_dtype is None and spec.default_compute_dtype is not None:
        if spec.default_compute_dtype == "float64" and not _xp.has_float64(xp):
            warnings.warn(f"{method} computes in float32: JAX's float64 is off. Enable "
                          "it (jax.config.update('jax_enable_x64', True)) for its float64 "
                          "default, or pass compute_dtype='float32' to accept float32",
                          UserWarning, stacklevel=3)
        else:
            work_name = spec.default_compute_dtype
    require_dtypes(spec, work_name, matmul_dtype)
    if eps > float(xp.finfo(getattr(xp, work_name)).max) / 4:
        raise ValueError(f"eps={eps:g} is beyond the range of the {work_name} computation "
                         "(A + eps·I would overflow); pass a smaller eps, or float64 "
                         "input or compute_dtype='float64'")
    if rtol is not None:
        rtol = check_rtol(rtol, unit_roundoff(xp, getattr(xp, work_name)))
    if tol is None and rtol is not None:
        tol = rtol * spec.rtol_stop_fraction if spec.iterative else rtol
    elif tol is None:
        tol = default_tol(method, work_name)
    if max_iter is None:
        max_iter = default_max_iter(method)

    batch = tuple(a.shape[:-2])
    n = a.shape[-1]
    traced = _xp.is_traced(a)
    if traced and fallback is not None:
        raise ValueError("fallback= re-solves the matrices that failed their check, which "
                         "reads them from the host: not possible under jax.jit or "
                         "torch.compile. Pass fallback=None and re-solve where "
                         "result.converged is False outside the compiled function")
    b = math.prod(batch)
    if b == 0 or n == 0:
        return _empty_result(xp, a, batch, method)

    bounds = {name: check_bound(value, name, xp, batch) for name, value in
              (("lambda_max_upper", lambda_max_upper), ("lambda_min_lower", lambda_min_lower))}
    options = dict(p=p, method=method, eps=eps, scaling=scaling, tol=tol, rtol=rtol,
                   max_iter=max_iter, certificate=certificate,
                   **bounds,
                   matmul_dtype=matmul_dtype, work_name=work_name)
    if _xp.is_jax_namespace(xp) and not traced and spec.needs_scaling:
        # Eager JAX dispatches, and first compiles, every operation on its own: for the
        # iterative methods' hundreds of small operations one compiled call per shape is
        # faster from the first call on. A direct method is a few operations, and eagerly
        # its float32 screen picks on the host the matrices that need float64.
        if check_finite and not bool(xp.all(xp.isfinite(a))):
            raise ValueError(_NONFINITE_INPUT)
        result, usable, cast_trouble = _xp.jax_compiled(_solve_stack, a,
                                                        check_finite=False, **options)
    else:
        result, usable, cast_trouble = _solve_stack(a, check_finite=check_finite, **options)
    if not traced and bool(cast_trouble):
        warnings.warn(
            f"inv_root_info: some roots overflow or lose their precision in {a.dtype} "
            f"(computed in {work_name}, or in the cast back; entries beyond its range); "
            "they are "
            "converged=False. Pass a wider input dtype or a larger eps",
            ConvergenceWarning, stacklevel=2)
    if fallback is not None:
        result = _repair(xp.reshape(a, (b, n, n)), result, usable, p, eps, fallback, rtol)
    return _reshaped(xp, result, batch)


def _solve_stack(a, *, p, method, eps, scaling, tol, rtol, max_iter, matmul_dtype, work_name,
                 check_finite, certificate, lambda_max_upper=None, lambda_min_lower=None):
    """The validated call on a non-empty stack: the flat ``(b, ...)`` result, which
    matrices were finite with a positive λmax bound (the others get NaN roots), and a
    0-d flag, True where some root lost its precision in the cast back to ``a.dtype``."""
    xp = _xp.array_namespace(a)
    spec = get_solver(method)
    batch = tuple(a.shape[:-2])
    n = a.shape[-1]
    dev = _xp.device_of(a)
    traced = _xp.is_traced(a)
    b = math.prod(batch)
    work_dtype = getattr(xp, work_name)
    stack = xp.reshape(xp.astype(a, work_dtype, copy=False), (b, n, n))
    finite = _xp.finite_matrices(stack)
    # Traced (jax.jit, torch.compile) values cannot be read: non-finite matrices
    # come back NaN, and every matrix takes the select below.
    all_finite = False if traced else bool(xp.all(finite))
    # The input itself is read again only to tell its NaN/Inf from an overflowing cast.
    if check_finite and not traced and not all_finite and not bool(xp.all(xp.isfinite(a))):
        raise ValueError(_NONFINITE_INPUT)
    eye = _xp.identity_stack(xp, n, work_dtype, dev)
    # Non-finite matrices are swapped for I, so no NaN enters the shared loop.
    if not all_finite:
        stack = _xp.batched_where(finite, stack, eye)
    # An exact power-of-two scale first, so that symmetrising (×0.5) cannot round
    # subnormal entries away nor overflow huge ones; the ridge is part of it, so
    # eps / magnitude stays in range.
    magnitude = _xp.power_of_two_scale(stack, eps)
    stack = _xp.symmetric_part(stack / magnitude[:, None, None])
    ridge = eps / magnitude
    # A direct method adds the ridge itself, in the dtype it decomposes in (evd's
    # float64 eigh of a float32 stack gets the ridge in float64).
    if eps > 0 and spec.needs_scaling:
        stack = _xp.add_scaled_identity(stack, ridge)

    ritz = None
    solver_ridge: dict = {}
    if not spec.needs_scaling:
        # A direct method (eigh) takes the spectrum as it is: no bound to certify.
        lam_max = certify_cost = None
        scale = xp.ones(stack.shape[:1], dtype=work_dtype, device=dev)
        scaled = stack
        solver_ridge = {"ridge": ridge} if eps > 0 else {}
    elif lambda_max_upper is not None:
        # The caller's bound is used as given: nothing is spent to find one. A bound
        # below λmax leaves the basin, which the check of the root catches.
        ritz = ritz_values(stack)
        lam_max = _per_matrix(xp, lambda_max_upper, b, work_dtype, dev) / magnitude
        certify_cost = xp.zeros_like(lam_max)
    elif scaling == "power":
        # One Lanczos run serves the λmax candidate, the λmin estimate and the
        # check's κ (Ritz values scale with the matrix).
        ritz = ritz_values(stack)
        top = ritz.high if traced else _xp.from_numpy(xp, ritz.high, dtype=work_dtype,
                                                     device=dev)
        certified = certified_lambda_max(stack, estimate=top)
        lam_max, certify_cost = certified.bound, certified.matmul_equivalents
    else:
        lam_max = lambda_max_bound_core(stack, scaling=scaling)
        certify_cost = xp.zeros_like(lam_max)
    if lam_max is not None:
        scale = xp.where(lam_max > 0, lam_max, xp.ones_like(lam_max))
        scaled = stack / scale[:, None, None]
    if ritz is not None:
        ritz = ritz.divided(scale)

    solver_kwargs = dict(tol=tol, max_iter=max_iter, scaling=scaling,
                         **(solver_ridge if not spec.needs_scaling else {}),
                         check_every=4 if _xp.is_accelerator(xp, a) else 1,
                         matmul=_xp.Matmul(xp, None if matmul_dtype is None
                                           else _xp.dtype_from_name(xp, matmul_dtype)))
    if spec.needs_lower_bound:
        floor = ridge if lambda_min_lower is None else xp.maximum(
            ridge, _per_matrix(xp, lambda_min_lower, b, work_dtype, dev) / magnitude)
        solver_kwargs["lower"], ritz = _lower_bound(scaled, floor / scale, ritz,
                                                    has_ridge=eps > 0
                                                    or lambda_min_lower is not None,
                                                    from_spectrum=spec.lower_from_spectrum)
    out = spec.solve(scaled, p, **solver_kwargs)
    if lam_max is None:
        lam_max = out.lambda_max
    if certify_cost is None:
        certify_cost = xp.zeros_like(lam_max)
    nonzero = lam_max > 0

    unit = unit_roundoff(xp, work_dtype)
    check = out.check if out.check is not None else check_root(
        scaled, out.root, p, unit_roundoff=unit, ritz=ritz, certificate=certificate)
    probed = out.check is None and isinstance(p, int) and certificate == "randomized"
    precision = work_name if not spec.forms_matmuls or matmul_dtype is None else matmul_dtype
    target = accuracy_target(method, precision, p, check.kappa)
    usable = finite & nonzero
    # One pass: the unscaling factor is NaN for the matrices that get NaN roots.
    factor = _xp.inverse_root_entries(magnitude, p)
    if spec.needs_scaling:
        factor = factor * _xp.inverse_root_entries(scale, p)
    root = out.root * xp.where(usable, factor, xp.full_like(factor, float("nan")))[:, None, None]
    returned = xp.astype(root, a.dtype, copy=False)
    # The root the caller gets is what is judged: finite in the output dtype (an
    # unscaled root can overflow where the scaled one did not), and changed by the
    # cast by at most one unit roundoff of that dtype.
    fits = _xp.finite_matrices(returned)
    computed = usable & _xp.finite_matrices(root)
    cast_error, cast_ok = _cast_back_error(returned, root, computed)
    error_estimate = xp.where(fits & computed, check.error_estimate + cast_error,
                              xp.full_like(cast_error, float("inf")))
    accuracy = (xp.full_like(target, rtol) if rtol is not None
                else xp.maximum(target, xp.full_like(target, tol)))
    converged = is_converged(out.converged | (tol == 0), usable & check.positive & fits & cast_ok,
                             check.error_estimate, accuracy)
    lam_max = lam_max * magnitude
    nan_b = xp.full_like(lam_max, float("nan"))
    residual = xp.where(usable, check.residual if isinstance(p, int) else out.residual,
                        nan_b)
    result = InvRootResult(
        root=returned,
        residual=residual,
        iterations=out.iterations,
        converged=converged,
        lambda_max=xp.where(finite, lam_max, nan_b),
        matmuls=out.matmuls,
        method=method,
        error_estimate=xp.where(usable, error_estimate, nan_b),
        repaired=xp.zeros_like(converged),
        check_matmuls=certify_cost + check.matmul_equivalents,
        failure_probability=FAILURE_PROBABILITY if probed else 0.0,
    )
    overflow = usable & check.positive & ~(fits & cast_ok)
    return result, usable, xp.any(overflow)


def _per_matrix(xp, value, b, dtype, device):
    """A caller's scalar or batch-shaped bound as a flat ``(b,)`` array."""
    return xp.reshape(xp.broadcast_to(xp.asarray(value, dtype=dtype, device=device),
                                      (b,) if xp.asarray(value).ndim == 0 else
                                      xp.asarray(value).shape), (b,))


def _reshaped(xp, result, batch):
    """The flat ``(b, ...)`` fields of a result in the input's batch shape."""
    fields = {name: xp.reshape(value, batch) for name, value in result._asdict().items()
              if name not in ("root", "method", "failure_probability")}
    return result._replace(root=xp.reshape(result.root, (*batch, *result.root.shape[-2:])),
                           **fields)


def _cast_back_error(returned, root, computed):
    """Relative Frobenius change of each root by the cast to the output dtype, and
    whether it is at most one unit roundoff of that dtype (finite, within range)."""
    xp = _xp.array_namespace(root)
    if returned.dtype == root.dtype:
        zero = xp.zeros(root.shape[:1], dtype=root.dtype, device=_xp.device_of(root))
        return zero, xp.ones(root.shape[:1], dtype=xp.bool, device=_xp.device_of(root))
    safe = _xp.batched_where(computed, root, xp.ones_like(root))
    back = _xp.batched_where(computed, xp.astype(returned, root.dtype), safe)
    entry = xp.max(xp.abs(safe), axis=(-2, -1))
    entry = xp.where(entry > 0, entry, xp.ones_like(entry))[:, None, None]
    change = _xp.frobenius_norm((back - safe) / entry) / _xp.frobenius_norm(safe / entry)
    change = xp.where(xp.isfinite(change), change, xp.full_like(change, float("inf")))
    return change, change <= float(xp.finfo(returned.dtype).eps) / 2


def _repair(stack, result, usable, p, eps, fallback, rtol):
    """Re-solve the matrices that failed their check with ``fallback`` in float64,
    held to the same accuracy target ``rtol`` (None: the table)."""
    xp = _xp.array_namespace(stack)
    failed = _xp.to_numpy(~result.converged & usable)
    where = np.nonzero(failed)[0]
    if where.size == 0:
        return result
    index = _xp.from_numpy(xp, where, dtype=xp.int64, device=_xp.device_of(stack))
    fix = inv_root_info(xp.take(stack, index, axis=0), p, method=fallback, eps=eps,
                        rtol=rtol, compute_dtype="float64", check_finite=False)
    position = np.zeros(failed.shape, dtype=np.int64)
    position[where] = np.arange(where.size)
    gather = _xp.from_numpy(xp, position, dtype=xp.int64, device=_xp.device_of(stack))
    mask = _xp.from_numpy(xp, failed, device=_xp.device_of(stack))

    def merged(new, old):
        taken = xp.take(new, gather, axis=0)
        if taken.ndim == 3:
            return _xp.batched_where(mask, taken, old)
        return xp.where(mask, xp.astype(taken, old.dtype), old)

    return result._replace(
        root=merged(fix.root, result.root), residual=merged(fix.residual, result.residual),
        converged=merged(fix.converged, result.converged),
        error_estimate=merged(fix.error_estimate, result.error_estimate),
        lambda_max=merged(fix.lambda_max, result.lambda_max),
        check_matmuls=merged(fix.check_matmuls, result.check_matmuls),
        repaired=mask)


@_with_signature_of(inv_root_info)
def inv_root(a: Array, /, p: float, **options: Any) -> Array:
    """Inverse p-th root ``(A + eps·I)^(-1/p)`` of every matrix in a stack.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive (semi)definite matrices of any supported backend
        (NumPy, CuPy, PyTorch, array-api-strict). The symmetric part
        ``(A + Aᵀ)/2`` is used, so rounding-level asymmetry does not matter.
    p : float
        Root order, ``> 0``. Each method states the p it takes in its registry
        entry (the built-in ones: any real p for ``"evd"``, integers for
        ``"coupled_newton"`` and ``"chebyshev"``, powers of two for
        ``"newton_db"`` and ``"minimax"``); another p is a ValueError that names
        the methods that take it.
    method : str
        ``"auto"`` or a registered solver (built in: ``"evd"``, ``"newton_db"``,
        ``"coupled_newton"``, ``"chebyshev"``, ``"minimax"``; see
        :mod:`matroot.solvers.registry`). ``"auto"`` picks by backend, device
        and p (:func:`matroot.choose_method`).
    eps : float
        Ridge added to the diagonal before the root is taken, ``>= 0``.
    scaling : {"power", "frobenius"}
        How λmax is estimated to scale the spectrum into the solver's basin.
    tol : float, optional
        Per-matrix residual at which an iterative solver stops (chebyshev: the
        target relative error of its fit). ``tol=0`` with ``max_iter=k`` runs
        exactly k steps. Default: :func:`matroot.default_tol`, or
        ``rtol·rtol_stop_fraction`` (the method's registry entry; 1/8 for the
        coupled iterations, 1/2 for chebyshev) when ``rtol`` is given.
    rtol : float, optional
        The accuracy target: the relative Frobenius error
        ``‖X̃ − X‖_F/‖X‖_F`` asked of every root, the quantity the README's
        accuracy table states, in ``(0, 1]`` and at least 10 unit roundoffs of
        the compute dtype. ``tol`` is when the iteration stops, ``rtol`` what
        ``converged`` promises: a root is converged when its certified
        ``error_estimate`` is at most ``rtol``, and each matrix stops as soon as
        its own residual is below the ``tol`` derived from ``rtol``, so a loose
        target costs fewer products. Default None: the table's target for each
        matrix's κ (or a looser ``tol``), today's behaviour.
    max_iter : int, optional
        Cap on iterations (on the degree for chebyshev).
    matmul_dtype : {None, "float16", "bfloat16"}
        Round matmul operands to 16 bits with float32 accumulation.
    check_finite : bool
        Raise ValueError on NaN/Inf input. With False, affected matrices come back
        NaN with ``converged=False`` and the others are unaffected.
    compute_dtype : {None, "float32", "float64"}
        Dtype of the computation. Default: float64 for ``"evd"`` and for float64
        input, else float32 (16-bit inputs are computed in float32).
    fallback : {None, "evd"}
        Re-solve the matrices whose a-posteriori check failed with this method in
        float64 (``InvRootResult.repaired`` says which). Default None: nothing is
        re-solved, failures are reported (``converged=False``, a warning). Its
        cost is one float64 eigh per failed matrix, and nothing when all pass.
    lambda_max_upper : float or array of shape ``a.shape[:-2]``, optional
        A certified upper bound on λmax(A + eps·I) that you already know (e.g.
        carried from a previous refresh: λmax(β·L + (1−β)·GGᵀ) ≤ β·λmax(L) +
        (1−β)·‖G‖²_F). Then no bound is computed (no Cholesky test). A wrong
        (too small) bound is caught by the check of the root: the matrix is
        ``converged=False``, never a wrong root reported converged.
    certificate : {"deterministic", "randomized"}
        How the returned root is checked (:func:`matroot.verify.check_root`):
        with every product of its residual formed, or with products of the
        residual and a block of Gaussian vectors only (O(p·n²) per vector instead
        of O(n³); its bounds fail with probability at most 1e-12 per matrix,
        ``InvRootResult.failure_probability``). Both also test X's sign with a
        Cholesky factorisation (even p).
    lambda_min_lower : float or array of shape ``a.shape[:-2]``, optional
        A lower bound on λmin(A + eps·I), used by ``minimax`` and ``chebyshev``
        instead of their estimate (never below eps). A bound that is too high is
        caught by the check of the root as well.

    Returns
    -------
    array, shape (..., n, n)
        Same namespace, device, shape and dtype as ``a``.

    Raises
    ------
    ValueError
        Bad shape, p, eps, option, or non-finite input with ``check_finite``.
    TypeError
        Integer, boolean or complex input.

    Warns
    -----
    ConvergenceWarning
        When matrices did not converge or came back non-finite; call
        :func:`inv_root_info` to see which.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.diag([16.0, 81.0])
    >>> np.round(matroot.inv_root(a, 4, method="newton_db"), 6)
    array([[0.5     , 0.      ],
           [0.      , 0.333333]])
    """
    result = inv_root_info(a, p, **options)
    xp = _xp.array_namespace(result.root)
    if _xp.is_traced(result.root):
        return result.root  # no host read when traced: inv_root_info says which failed
    failed = ~usable_roots(result, options.get("tol"))
    count = int(xp.sum(xp.astype(failed, xp.int32)))
    if count:
        warnings.warn(
            f"inv_root(method={result.method!r}): {count} of {math.prod(failed.shape)} "
            "matrices did not converge or are not positive definite; "
            "inv_root_info tells which", ConvergenceWarning, stacklevel=2)
    return result.root


def usable_roots(result: InvRootResult, tol: float | None = None) -> Array:
    """Per-matrix mask of the roots in ``result`` that are fit to use: ``result.converged``.

    Every root is judged by the same check, fixed step counts (``tol=0``)
    included: a root is fit to use when it converged. ``tol`` is accepted for
    the callers of earlier versions and not needed.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> res = matroot.inv_root_info(np.eye(2)[None], 2, method="newton_db", tol=0,
    ...                             max_iter=3)
    >>> res.converged.tolist(), matroot.usable_roots(res).tolist()
    ([True], [True])
    """
    return result.converged


def _lower_bound(scaled, eps_scaled, ritz, *, has_ridge: bool, from_spectrum: bool):
    """A lower bound on the scaled spectrum: the ridge when there is one (a guarantee),
    else the Lanczos estimate (its Ritz value errs high, hence its safety factor).

    ``from_spectrum``: the Lanczos estimate, never below the ridge, even with one
    (chebyshev's degree grows with the interval, and a ridge far below the
    spectrum would push it to its cap; a bound that is too high is caught by the
    a-posteriori check). Under jax.jit / torch.compile the estimate is formed on
    the device, with no host read.

    ``ritz``: the call's :class:`~matroot.scaling.RitzValues` of ``scaled``, or
    None (then a run is made here when needed). Returns ``(bound, ritz)``, the
    run passed on to the check, which reads its κ from it."""
    if has_ridge and not from_spectrum:
        return eps_scaled, ritz
    xp = _xp.array_namespace(scaled)
    if ritz is None:
        ritz = ritz_values(scaled)
    estimate = lambda_min_estimate_core(scaled, xp.ones_like(eps_scaled), ritz=ritz)
    return xp.maximum(estimate, eps_scaled), ritz


def _empty_result(xp, a, batch, method):
    dev = _xp.device_of(a)
    real = xp.zeros(batch, dtype=a.dtype, device=dev)
    count = xp.zeros(batch, dtype=xp.int32, device=dev)
    return InvRootResult(xp.zeros(a.shape, dtype=a.dtype, device=dev), real, count,
                         xp.ones(batch, dtype=xp.bool, device=dev), real, count, method,
                         real, xp.zeros(batch, dtype=xp.bool, device=dev), real)
