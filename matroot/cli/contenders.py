"""The contenders the demo and the benchmarks time, and the numbers kept of each call.

A contender is a matroot method (through the public ``inv_root_info``) or one
of the eigh baselines a user would write without matroot: one batched eigh, or
a Python loop of eigh over the matrices (Distributed Shampoo's structure). The
tools' one reader of the solver registry (:mod:`matroot.solvers.registry`) for which
methods exist and which p each supports (:func:`all_methods`, :func:`method_supports`).
"""

from __future__ import annotations

import numpy as np
from array_api_compat import array_namespace, device

import matroot
from matroot.solvers.registry import solver_names, solvers_supporting
from matroot.testing import relative_error

__all__ = ["BASELINES", "all_methods", "method_supports", "eigh_root_batched",
           "eigh_root_loop", "contender", "summarise"]

#: The eigh baselines, timed next to matroot's methods.
BASELINES = ("eigh_batched", "eigh_loop")


def all_methods() -> list[str]:
    """Every registered solver name."""
    return list(solver_names())


def method_supports(method: str, p) -> bool:
    """Whether the solver ``method`` can compute A^(-1/p)."""
    return method in solvers_supporting(p)


def eigh_root_batched(xp, a, p, eps: float = 0.0):
    """``Q diag(λ^(-1/p)) Qᵀ`` of ``a + eps·I`` from one batched ``xp.linalg.eigh`` call.

    Eigenvalues are clamped at the dtype's smallest normal number (as a user of
    eigh must), so rounding-level negatives give large but finite roots.

    Examples
    --------
    >>> import numpy as np
    >>> from array_api_compat import array_namespace
    >>> from matroot.cli.contenders import eigh_root_batched, eigh_root_loop
    >>> a = np.stack([np.diag([4.0, 16.0]), np.diag([1.0, 9.0])])
    >>> eigh_root_batched(array_namespace(a), a, 2).diagonal(axis1=1, axis2=2).tolist()
    [[0.5, 0.25], [1.0, 0.3333333333333333]]
    >>> len(eigh_root_loop(array_namespace(a), a, 2))
    2
    """
    if eps:
        a = a + eps * xp.eye(a.shape[-1], dtype=a.dtype, device=device(a))
    lam, q = xp.linalg.eigh(a)
    lam = xp.maximum(lam, xp.full_like(lam, xp.finfo(lam.dtype).smallest_normal))
    return (q * (lam ** (-1.0 / p))[..., None, :]) @ xp.matrix_transpose(q)


def eigh_root_loop(xp, a, p, eps: float = 0.0):
    """The same root, one matrix at a time in a Python loop (Distributed Shampoo's way)."""
    return [eigh_root_batched(xp, a[i, ...], p, eps) for i in range(a.shape[0])]


def contender(a, method: str, p, **options):
    """A zero-argument callable computing one contender's roots of ``a``."""
    if method in BASELINES:
        xp = array_namespace(a)
        eps = options.get("eps", 0.0)
        root = eigh_root_batched if method == "eigh_batched" else eigh_root_loop
        return lambda: root(xp, a, p, eps)
    return lambda: matroot.inv_root_info(a, p, method=method, **options)


def summarise(target, result, exact) -> dict:
    """Per-call numbers of an inv_root_info result or a baseline's roots.

    Errors are relative Frobenius errors against the float64 ``exact`` roots;
    a maximum or median is None (JSON null) when any matrix came back NaN/Inf.
    """
    if isinstance(result, matroot.InvRootResult):
        errors = relative_error(target.to_host(result.root), exact)
        matmuls = target.to_host(result.matmuls).astype(float)
        residual = target.to_host(result.residual).astype(float)
        converged = target.to_host(result.converged)
        iterations = target.to_host(result.iterations)
        return dict(
            err_max=finite_max(errors), err_median=finite_median(errors),
            matmuls=int(matmuls.max()), matmuls_mean=float(matmuls.mean()),
            iterations=int(iterations.max()), iterations_min=int(iterations.min()),
            residual=finite_max(residual), converged=float(converged.mean()),
            converged_count=int(converged.sum()), resolved_method=result.method)
    roots = np.stack([target.to_host(x) for x in result]) if isinstance(result, list) \
        else target.to_host(result)
    errors = relative_error(roots, exact)
    finite = np.isfinite(errors)
    return dict(err_max=finite_max(errors), err_median=finite_median(errors),
                matmuls=0, matmuls_mean=0.0, iterations=0, iterations_min=0, residual=None,
                converged=float(np.mean(finite)), converged_count=int(finite.sum()),
                resolved_method=None)


def finite_max(values) -> float | None:
    """The largest value, or None (JSON null) when any is NaN/Inf: a failed matrix."""
    values = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(values)):
        return None
    return float(values.max())


def finite_median(values) -> float | None:
    values = np.asarray(values, dtype=float)
    return float(np.median(values)) if np.all(np.isfinite(values)) else None
