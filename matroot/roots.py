"""The public entry points: validate → regularise → scale → solve → unscale → report."""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Any, NamedTuple

from . import _xp
from ._checks import (
    COMPUTE_DTYPES,
    SCALINGS,
    check_choice,
    check_matmul_dtype,
    check_max_iter,
    check_nonnegative,
    check_p,
    check_stack,
)
from .scaling import lambda_max_bound_core, lambda_min_estimate_core
from .solvers import get_solver
from .solvers.auto import choose_method
from .solvers.registry import check_method, require_dtypes, require_support
from ._typing import Array

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
        The method's final residual: ``‖I − ZY‖_F/√n`` (newton_db, worst stage;
        minimax, worst stage divided by the factor its error shrinks by in the
        root), ``‖I − M‖_F/√n`` (coupled_newton), the fit's relative error bound
        (chebyshev), the relative negative-eigenvalue deficit (evd).
    iterations : array, shape (...)
        Steps taken per matrix (polynomial degree for chebyshev, 0 for evd).
    converged : array of bool, shape (...)
        True where the residual met ``tol`` with a finite result.
    lambda_max : array, shape (...)
        The λmax upper estimate of ``A + eps·I`` used to scale it.
    matmuls : array, shape (...)
        n×n matrix products spent on each matrix (0 for evd).
    method : str
        The solver that ran (what ``"auto"`` resolved to).
    """

    root: Array
    residual: Array
    iterations: Array
    converged: Array
    lambda_max: Array
    matmuls: Array
    method: str


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
                  max_iter: int | None = None, matmul_dtype: str | None = None,
                  check_finite: bool = True,
                  compute_dtype: str | None = None) -> InvRootResult:
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
        _xp.register_jax_pytree(InvRootResult, ("method",))
    check_method(method)
    p = check_p(p)
    require_support(method, p)
    eps = check_nonnegative(eps, "eps")
    check_choice(scaling, "scaling", SCALINGS)
    check_choice(compute_dtype, "compute_dtype", COMPUTE_DTYPES)
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
    if tol is None:
        tol = default_tol(method, work_name)
    if max_iter is None:
        max_iter = default_max_iter(method)

    batch = tuple(a.shape[:-2])
    n = a.shape[-1]
    dev = _xp.device_of(a)
    traced = _xp.is_traced(a)
    # Traced (jax.jit, torch.compile) values cannot be read: non-finite matrices
    # come back NaN.
    if check_finite and not traced and not bool(xp.all(xp.isfinite(a))):
        raise ValueError("a contains NaN or Inf (pass check_finite=False to get NaN "
                         "roots for those matrices instead)")
    b = math.prod(batch)
    if b == 0 or n == 0:
        return _empty_result(xp, a, batch, method)

    work_dtype = getattr(xp, work_name)
    stack = xp.reshape(xp.astype(a, work_dtype), (b, n, n))
    finite = xp.all(xp.isfinite(stack), axis=(-2, -1))
    eye = _xp.identity_stack(xp, n, work_dtype, dev)
    # Non-finite matrices are swapped for I, so no NaN enters the shared loop.
    stack = _xp.batched_where(finite, _xp.symmetric_part(stack), eye)
    if eps > 0:
        stack = stack + eps * eye

    lam_max = lambda_max_bound_core(stack, scaling=scaling)
    nonzero = lam_max > 0
    scale = xp.where(nonzero, lam_max, xp.ones_like(lam_max))
    scaled = stack / scale[:, None, None]

    solver_kwargs = dict(tol=tol, max_iter=max_iter, scaling=scaling,
                         check_every=4 if _xp.is_accelerator(xp, a) else 1,
                         matmul=_xp.Matmul(xp, None if matmul_dtype is None
                                           else _xp.dtype_from_name(xp, matmul_dtype)))
    if spec.needs_lower_bound:
        if traced and eps == 0:
            raise ValueError(f"method={method!r} under jax.jit or torch.compile needs "
                             "eps > 0 (the ridge is its lower bound; the λmin estimate "
                             "for eps = 0 reads the host), or use 'newton_db' / "
                             "'coupled_newton'")
        solver_kwargs["lower"] = _lower_bound(scaled, eps / scale)
    out = spec.solve(scaled, p, **solver_kwargs)

    root = out.root * (scale ** (-1.0 / p))[:, None, None]
    usable = finite & nonzero
    root = _xp.batched_where(usable, root, xp.full_like(root, float("nan")))
    nan_b = xp.full_like(out.residual, float("nan"))
    residual = xp.where(usable, out.residual, nan_b)
    converged = out.converged & usable & xp.all(xp.isfinite(root), axis=(-2, -1))

    root = xp.reshape(xp.astype(root, a.dtype), (*batch, n, n))
    return InvRootResult(
        root=root,
        residual=xp.reshape(residual, batch),
        iterations=xp.reshape(out.iterations, batch),
        converged=xp.reshape(converged, batch),
        lambda_max=xp.reshape(xp.where(finite, lam_max, nan_b), batch),
        matmuls=xp.reshape(out.matmuls, batch),
        method=method,
    )


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
        exactly k steps. Default: :func:`matroot.default_tol`.
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


def usable_roots(result: InvRootResult, tol: float | None) -> Array:
    """Per-matrix mask of the roots in ``result`` that are fit to use.

    A root is usable when it converged; with ``tol=0`` for an iterative method
    (a fixed step count, which never reports convergence) when its residual
    and entries are finite.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> res = matroot.inv_root_info(np.eye(2)[None], 2, method="newton_db", tol=0,
    ...                             max_iter=3)
    >>> res.converged.tolist(), matroot.usable_roots(res, 0).tolist()
    ([False], [True])
    """
    xp = _xp.array_namespace(result.root)
    if tol == 0 and get_solver(result.method).iterative:
        return xp.isfinite(result.residual) & xp.all(xp.isfinite(result.root), axis=(-2, -1))
    return result.converged


def _lower_bound(scaled, eps_scaled):
    """A lower bound on the scaled spectrum: the ridge when there is one (a guarantee),
    else the Lanczos estimate (its Ritz value errs high, hence its safety factor)."""
    xp = _xp.array_namespace(scaled)
    if _xp.is_traced(scaled) or bool(xp.all(eps_scaled > 0)):
        return eps_scaled
    estimate = lambda_min_estimate_core(scaled, xp.ones_like(eps_scaled))
    return xp.where(eps_scaled > 0, eps_scaled, estimate)


def _empty_result(xp, a, batch, method):
    dev = _xp.device_of(a)
    real = xp.zeros(batch, dtype=a.dtype, device=dev)
    count = xp.zeros(batch, dtype=xp.int32, device=dev)
    return InvRootResult(xp.zeros(a.shape, dtype=a.dtype, device=dev), real, count,
                         xp.ones(batch, dtype=xp.bool, device=dev), real, count, method)
