"""Inverse p-th roots from the symmetric eigendecomposition, any real p > 0.

One eigh per matrix, and no spectral scaling (eigh needs none). A float32 eigh
perturbs the small eigenvalues by about ``u·λmax`` (u the unit roundoff), so the
root's relative error is about ``C·κ·u/p`` with ``C ≤ 3`` (measured with torch/MKL,
n = 4 to 256, geometric spectra), plus a floor near ``3e-6``. Where that estimate,
formed from the float32 eigenvalues themselves, does not meet the README's float32
accuracy table with a margin of 2, that matrix alone is solved again in float64
(as Distributed Shampoo retries failed eighs), so on a well-conditioned stack the
call costs one float32 eigh and on an ill-conditioned one a float32 eigh plus a
float64 eigh of the matrices that need it. Backends whose float32 eigh runs in
float64 anyway (NumPy) never retry.
"""

from __future__ import annotations

from .. import _xp
from ._result import SolverOutput
from .registry import ANY_REAL_P, SolverSpec

#: Measured bound on ``error / (κ·u/p)`` of a float32 eigh root, and its floor.
FLOAT32_ERROR_FACTOR = 3.0
FLOAT32_ERROR_FLOOR = 3e-6
#: Share of the table's error a float32 result may use.
FLOAT32_MARGIN = 0.5


def _eigh_or_none(xp, a):
    try:
        return xp.linalg.eigh(a)
    except Exception:  # LinAlgError differs per backend; the retry handles all.
        return None


def float32_eigh_suffices(lam, p):
    """Per matrix: whether a float32 eigh with eigenvalues ``lam`` meets the table.

    Parameters
    ----------
    lam : array, shape (b, n)
        Ascending float32 eigenvalues of each matrix.
    p : float
        Root order.

    Returns
    -------
    array of bool, shape (b,)
        False for non-finite or non-positive spectra, and where the estimated
        error ``C·κ·u/p`` plus its floor exceeds half the table's entry for κ.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.solvers.evd import float32_eigh_suffices
    >>> lam = np.array([[1.0, 2.0], [1e-4, 1.0]], dtype=np.float32)
    >>> float32_eigh_suffices(lam, 2).tolist()
    [True, False]
    """
    # The table is stated once, in matroot.testing (imported here, not at the top:
    # that package imports the solver registry this module is part of).
    from ..testing.tolerances import ACCURACY_TABLE, KAPPA_BUCKETS

    xp = _xp.array_namespace(lam)
    smallest, largest = lam[:, 0], lam[:, -1]
    finite = xp.all(xp.isfinite(lam), axis=-1)
    positive = finite & (smallest > 0)
    kappa = largest / xp.where(positive, smallest, xp.ones_like(smallest))
    u = float(xp.finfo(lam.dtype).eps) / 2
    error = FLOAT32_ERROR_FLOOR + FLOAT32_ERROR_FACTOR * u / p * kappa
    allowed = xp.zeros_like(kappa)
    table = zip(KAPPA_BUCKETS, ACCURACY_TABLE[("evd", "float32")])
    for kappa_limit, table_error in reversed(list(table)):
        allowed = xp.where(kappa <= kappa_limit, FLOAT32_MARGIN * table_error, allowed)
    return positive & (error <= allowed)


def _root_from_eigh(xp, lam, q, p):
    safe = xp.where(lam > 0, lam, xp.ones_like(lam))
    return (q * (safe ** (-1.0 / p))[:, None, :]) @ xp.matrix_transpose(q)


def _retry_in_float64(xp, a, lam, root, redo, p):
    """Eigenvalues and roots of ``a`` with the ``redo`` matrices solved in float64."""
    picked = xp.nonzero(redo)[0]
    wide = _eigh_or_none(xp, xp.astype(xp.take(a, picked, axis=0), xp.float64))
    if wide is None:
        raise ValueError("eigh failed on this stack, also in float64")
    wide_lam = xp.astype(wide.eigenvalues, a.dtype)
    wide_root = xp.astype(_root_from_eigh(xp, wide.eigenvalues, wide.eigenvectors, p),
                          a.dtype)
    # Matrix i of the stack takes row position[i] of the float64 results where redone.
    position = xp.cumulative_sum(xp.astype(redo, xp.int64)) - 1
    position = xp.clip(position, 0, picked.shape[0] - 1)
    lam = xp.where(redo[:, None], xp.take(wide_lam, position, axis=0), lam)
    root = _xp.batched_where(redo, xp.take(wide_root, position, axis=0), root)
    return lam, root


def evd(a, p, *, float64_retry: bool = True, **_):
    """``a^(-1/p) = Q diag(λ^(-1/p)) Qᵀ`` from one ``eigh`` per matrix.

    Matrices with an eigenvalue ≤ 0 (singular or indefinite: there is no real
    inverse root) come back as NaN with ``converged=False``. For float32 input,
    matrices whose float32 eigh failed, came back non-finite or cannot meet the
    accuracy table (:func:`float32_eigh_suffices`) are solved again in float64
    when ``float64_retry``.

    Parameters
    ----------
    a : array, shape (b, n, n)
        Regularised, symmetric stack (any scale).
    p : float
        Root order, > 0.

    Returns
    -------
    SolverOutput
        ``residual`` is the relative deficit ``max(0, -λmin) / λmax`` (0 for SPD);
        ``lambda_max`` the largest eigenvalue.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.solvers.evd import evd
    >>> out = evd(np.diag([4.0, 16.0])[None], 2)
    >>> np.diag(out.root[0]).tolist(), out.lambda_max.tolist()
    ([0.5, 0.25], [16.0])
    """
    xp = _xp.array_namespace(a)
    b = a.shape[0]
    narrow = a.dtype == xp.float32 and float64_retry
    decomposition = _eigh_or_none(xp, a)
    if decomposition is None and narrow:
        # The whole float32 call failed: redo every matrix in float64.
        lam = xp.full((b, a.shape[-1]), float("nan"), dtype=a.dtype, device=_xp.device_of(a))
        root = xp.full_like(a, float("nan"))
        redo = xp.ones((b,), dtype=xp.bool, device=_xp.device_of(a))
        lam, root = _retry_in_float64(xp, a, lam, root, redo, p)
    elif decomposition is None:
        raise ValueError("eigh failed on this stack")
    else:
        lam, q = decomposition
        root = _root_from_eigh(xp, lam, q, p)
    # Under tracing nothing can be read back, so no matrix is retried there.
    if (decomposition is not None and narrow and not _xp.eigh_runs_in_float64(xp)
            and not _xp.is_traced(a)):
        redo = ~float32_eigh_suffices(lam, p)
        if bool(xp.any(redo)):
            lam, root = _retry_in_float64(xp, a, lam, root, redo, p)
    positive = xp.all(lam > 0, axis=-1)
    root = _xp.batched_where(positive, root, xp.full_like(root, float("nan")))
    lam_max = xp.max(xp.abs(lam), axis=-1)
    lam_max = xp.where(lam_max > 0, lam_max, xp.ones_like(lam_max))
    deficit = xp.maximum(-xp.min(lam, axis=-1), xp.zeros_like(lam_max)) / lam_max
    zeros = xp.zeros((b,), dtype=xp.int32, device=_xp.device_of(a))
    return SolverOutput(root, deficit, zeros, positive, zeros, xp.max(lam, axis=-1))


def _cost(p, kappa) -> float:
    return 0.0


SPEC = SolverSpec(
    name="evd",
    solve=evd,
    summary="CPUs; non-integer p; a reference (one batched eigh, float32 where it "
            "meets the accuracy table)",
    root_orders=ANY_REAL_P,
    default_tol={"float32": 0.0, "float64": 0.0},
    default_max_iter=1,
    cost=_cost,
    cost_summary="one batched eigh, no matmuls",
    iterative=False,
    forms_matmuls=False,
    needs_scaling=False,
    # float32 roots formed from float32 eigenvectors miss the table at κ ≈ 1e6
    # (1.4e-3 against 1e-3 measured); float32 stays available by compute_dtype.
    default_compute_dtype="float64",
    accuracy_row="evd",
)
