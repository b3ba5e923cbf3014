"""The README's accuracy table, as data, and the assertion that applies it.

The table lives in :mod:`matroot.certify.accuracy` (the library's check reads it there);
it is re-exported here for the README's readers, matroot's own accuracy tests and
:func:`matroot.testing.check_inv_root_solver`.

Examples
--------
>>> from matroot.testing import accuracy_tolerance
>>> accuracy_tolerance("float32", 3e3, 4)
0.001
>>> accuracy_tolerance("float32", 3e3, 4, method="evd")
0.0001
>>> accuracy_tolerance("float32", 1e6, 1)      # the plain inverse's float32 exception
0.05
>>> accuracy_tolerance("float64", 1e7) is None  # beyond the table: no target
True
"""

from __future__ import annotations

import numpy as np

from ..certify.accuracy import ACCURACY_TABLE, FLOAT32_INVERSE_TOLERANCE, KAPPA_BUCKETS
from ..solvers.registry import SOLVERS

__all__ = [
    "ACCURACY_TABLE",
    "KAPPA_BUCKETS",
    "accuracy_tolerance",
    "assert_inv_root_close",
    "assert_per_matrix",
    "case_tolerances",
    "dtype_name",
    "promised_tolerance",
]



def dtype_name(dtype) -> str:
    """The plain name ("float32") of a dtype given as a string, a NumPy or JAX scalar
    type, or any backend's dtype object."""
    try:
        return np.dtype(dtype).name
    except TypeError:  # torch.float32 and other dtype objects NumPy does not know
        return str(dtype).rsplit(".", 1)[-1]


def _row(method: str) -> str:
    """The table row of a row name or a registered matroot method."""
    rows = {row for row, _ in ACCURACY_TABLE}
    if method in rows:
        return method
    if method in SOLVERS:
        return SOLVERS[method].accuracy_row
    raise ValueError(f"method={method!r} is neither a row of the accuracy table "
                     f"{sorted(rows)} nor a registered method {sorted(SOLVERS)}")


def accuracy_tolerance(dtype: str, kappa: float, p: float = 2, *,
                       method: str = "iterative") -> float | None:
    """The relative error the README's table allows, or None where it sets no target.

    Parameters
    ----------
    dtype : {"float32", "float64"}
        The input's dtype.
    kappa : float
        Condition number of ``A + eps·I``.
    p : float
        The root (the float32 plain inverse, p = 1, has a looser target beyond κ = 1e4).
    method : str
        The table row ("evd", "iterative", "chebyshev"; "iterative" for your own
        solver) or a registered matroot method, which names its row.

    Returns
    -------
    float or None
        The tolerance, or None beyond κ = 1e6 (and for chebyshev at κ > 1e4).

    Raises
    ------
    ValueError
        For an unknown row or method, or a dtype the table has no column for.
    """
    key = (_row(method), dtype_name(dtype))
    if key not in ACCURACY_TABLE:
        raise ValueError(f"the accuracy table has rows for float32 and float64, not {dtype!r};"
                         " pass rtol= to set a tolerance yourself")
    bucket = int(np.searchsorted(KAPPA_BUCKETS, kappa * (1 - 1e-12)))
    if bucket == len(KAPPA_BUCKETS):
        return None
    tol = ACCURACY_TABLE[key][bucket]
    if tol is not None and p == 1 and key[1] == "float32" and bucket == 2:
        tol = FLOAT32_INVERSE_TOLERANCE
    return tol


def promised_tolerance(dtype: str, kappa, p: float = 2, *, method: str = "iterative",
                       tol: float | None = None, rtol: float | None = None) -> np.ndarray:
    """Per matrix, the relative error ``converged=True`` promises for these options.

    ``rtol`` where given; else the table's target at each κ (past κ = 1e6 the last
    column's, the README's rule), loosened to ``tol`` where ``tol`` is looser.

    Examples
    --------
    >>> from matroot.testing.tolerances import promised_tolerance
    >>> promised_tolerance("float32", [10.0, 1e5, 1e8], 2, tol=0.1).tolist()
    [0.1, 0.1, 0.1]
    >>> promised_tolerance("float32", [10.0, 1e8], 2).tolist()
    [0.0001, 0.02]
    """
    kappa = np.atleast_1d(np.asarray(kappa, dtype=np.float64))
    if rtol is not None:
        return np.full(kappa.shape, float(rtol))
    last = [t for t in ACCURACY_TABLE[(_row(method), dtype_name(dtype))] if t is not None][-1]
    if p == 1 and dtype_name(dtype) == "float32":
        last = max(last, FLOAT32_INVERSE_TOLERANCE)
    table = np.array([accuracy_tolerance(dtype, k, p, method=method) or last for k in kappa])
    return np.maximum(table, 0.0 if tol is None else float(tol))


def case_tolerances(case, p: float, method: str, rtol: float | None) -> np.ndarray:
    """Per-matrix tolerances for ``case``: ``rtol`` everywhere, or the table at each κ."""
    if rtol is not None:
        return np.full(case.batch_shape, float(rtol))
    tols = [accuracy_tolerance(case.dtype, k, p, method=method) for k in case.kappa.flat]
    if any(t is None for t in tols):
        raise ValueError(f"κ = {case.kappa.max():.3g} is beyond the accuracy table for "
                         f"{method!r} in {case.dtype}; pass rtol= or draw smaller κ")
    return np.reshape(np.array(tols, dtype=float), case.batch_shape)


def assert_per_matrix(errors, tolerances, case, what: str) -> None:
    """Raise AssertionError naming the matrix with the worst ``errors / tolerances``."""
    errors = np.broadcast_to(np.asarray(errors, dtype=float), case.batch_shape)
    ratio = np.where(np.isnan(errors), np.inf, errors / tolerances)
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), case.batch_shape))
    if ratio[worst] > 1.0:
        raise AssertionError(f"{what}: {case.describe(worst)}: error {errors[worst]:.3g} > "
                             f"tolerance {tolerances[worst]:.3g}")


def assert_inv_root_close(actual, case, p: float, *, eps: float | None = None,
                          rtol: float | None = None, method: str = "iterative") -> None:
    """Assert that ``actual`` is ``(case.a + eps·I)^(-1/p)`` to the README's accuracy.

    Parameters
    ----------
    actual : array
        The computed roots, any backend, shape ``case.a.shape``.
    case : SPDCase
        The case solved (from :func:`matroot.testing.spd_stacks`).
    p : float
        The root.
    eps : float, optional
        The ridge; defaults to ``case.eps``.
    rtol : float, optional
        Relative Frobenius tolerance; by default the accuracy table's entry for the
        case's dtype and each matrix's κ (:func:`accuracy_tolerance`).
    method : str
        Row of the table (see :func:`accuracy_tolerance`).

    Raises
    ------
    AssertionError
        Naming the worst matrix, its family, κ, error and tolerance.
    ValueError
        When a κ lies beyond the table and no ``rtol`` is given.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.testing import SPDCase, assert_inv_root_close
    >>> case = SPDCase(np.diag([1.0, 100.0]), eps=0.0, family="geometric")
    >>> assert_inv_root_close(np.diag([1.0, 0.1]), case, 2)
    >>> assert_inv_root_close(np.diag([1.0, 0.1001]), case, 2)
    Traceback (most recent call last):
    ...
    AssertionError: inverse root, p=2: ... κ=100, eps=0, float64: error 9.95e-05 > tolerance 1e-08
    """
    from .oracle import relative_error

    if not hasattr(actual, "shape"):
        raise TypeError(f"actual must be an array of roots (NumPy, torch, JAX, CuPy), got "
                        f"{type(actual).__name__}: pass np.asarray(actual)")
    if tuple(actual.shape) != tuple(case.a.shape):
        raise AssertionError(f"inverse root has shape {tuple(actual.shape)}, "
                             f"expected {tuple(case.a.shape)}")
    errors = relative_error(actual, case.inv_root(p, eps))
    assert_per_matrix(errors, case_tolerances(case, p, method, rtol), case,
                      f"inverse root, p={p:g}")
