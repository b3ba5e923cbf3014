"""Inverse p-th roots from the symmetric eigendecomposition, any real p > 0."""

from __future__ import annotations

from .. import _xp
from ._result import SolverOutput
from .registry import ANY_REAL_P, SolverSpec


def _eigh_or_none(xp, a):
    try:
        return xp.linalg.eigh(a)
    except Exception:  # LinAlgError differs per backend; the retry handles all.
        return None


def evd(a, p, *, float64_retry: bool = True, **_):
    """``a^(-1/p) = Q diag(λ^(-1/p)) Qᵀ`` from ``eigh``.

    Matrices with an eigenvalue ≤ 0 (singular or indefinite: there is no real
    inverse root) come back as NaN with ``converged=False``. For float32 input,
    a failed or non-finite eigh is retried in float64 when ``float64_retry``.

    Parameters
    ----------
    a : array, shape (b, n, n)
        Regularised, symmetric stack with spectrum in (0, 1].
    p : float
        Root order, > 0.

    Returns
    -------
    SolverOutput
        ``residual`` is the relative deficit ``max(0, -λmin) / λmax`` (0 for SPD).
    """
    xp = _xp.array_namespace(a)
    decomposition = _eigh_or_none(xp, a)
    # Under jax.jit eigh does not raise and nothing can be read back: no retry.
    bad = decomposition is None or (not _xp.is_traced(a) and not bool(
        xp.all(xp.isfinite(decomposition.eigenvalues))))
    if bad and float64_retry and a.dtype == xp.float32:
        wide = _eigh_or_none(xp, xp.astype(a, xp.float64))
        if wide is not None:
            decomposition = (xp.astype(wide.eigenvalues, a.dtype),
                             xp.astype(wide.eigenvectors, a.dtype))
    if decomposition is None:
        raise ValueError("eigh failed on this stack, also in float64")
    lam, q = decomposition
    b = a.shape[0]
    positive = xp.all(lam > 0, axis=-1)
    safe = xp.where(lam > 0, lam, xp.ones_like(lam))
    weights = safe ** (-1.0 / p)
    root = (q * weights[:, None, :]) @ xp.matrix_transpose(q)
    nan = xp.full_like(root, float("nan"))
    root = _xp.batched_where(positive, root, nan)
    lam_max = xp.max(xp.abs(lam), axis=-1)
    lam_max = xp.where(lam_max > 0, lam_max, xp.ones_like(lam_max))
    deficit = xp.maximum(-xp.min(lam, axis=-1), xp.zeros_like(lam_max)) / lam_max
    zeros = xp.zeros((b,), dtype=xp.int32, device=_xp.device_of(a))
    return SolverOutput(root, deficit, zeros, positive, zeros)


def _cost(p, kappa) -> float:
    return 0.0


SPEC = SolverSpec(
    name="evd",
    solve=evd,
    summary="CPUs; non-integer p; a reference (one batched eigh, float64 by default)",
    root_orders=ANY_REAL_P,
    default_tol={"float32": 0.0, "float64": 0.0},
    default_max_iter=1,
    cost=_cost,
    cost_summary="one batched eigh, no matmuls",
    iterative=False,
    forms_matmuls=False,
    # float32 eigh loses κ·u in the small eigenvalues (6e-2 at κ = 1e6 with MKL);
    # NumPy already computes eigh in float64 internally, so do so everywhere.
    default_compute_dtype="float64",
    accuracy_row="evd",
)
