"""What :func:`matroot.inv_root_info` returns: the root and its per-matrix diagnostics."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _xp
from .._typing import Array

__all__ = ["ConvergenceWarning", "InvRootResult", "empty_result", "reshaped"]


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
        :mod:`matroot.certify.verify`). For evd, which checks its root from its
        eigenvalues and forms no products, the relative negative-eigenvalue
        deficit of A + eps·I.
    iterations : array, shape (...)
        Steps taken per matrix (polynomial degree for chebyshev, 0 for evd).
    converged : array of bool, shape (...)
        True where the method stopped on ``tol`` (or its rounding floor), the
        root is finite in the output dtype, positive definite, and its
        ``error_estimate`` is within ``rtol`` when given, else within
        ``max(tol, target)``, the README accuracy table's target for its
        estimated κ (:func:`matroot.solvers.registry.accuracy_target`).
    lambda_max : array, shape (...)
        The certified upper bound on λmax of ``A + eps·I`` used to scale it.
    matmuls : array, shape (...)
        n×n matrix products the solver spent on each matrix (0 for evd).
    method : str
        The solver that ran (what ``"auto"`` resolved to).
    error_estimate : array, shape (...)
        Estimated relative forward error ``‖X̃ − X‖_F/‖X‖_F`` of the returned
        root (derivation in :mod:`matroot.certify.verify`; measured within 0.6–6× of
        the float64-oracle error, 0.8–3× on the accuracy suite; evd's from its eigenvalues,
        :func:`matroot.solvers.evd_accuracy.eigh_root_check`), plus the rounding of the cast
        back to the input dtype; ``inf`` for a root that is not positive definite.
    repaired : array of bool, shape (...)
        Matrices whose check failed and that ``fallback`` re-solved.
    check_matmuls : array, shape (...)
        Cost of certifying λmax and checking the root, in n×n matmul
        equivalents (a Cholesky counts 1/6, a matrix-vector product 1/n).
    failure_probability : float
        Probability, per matrix, that a randomized statement of this result is
        wrong (union bound): ``error_estimate`` too low because the check drew
        unlucky probes (:data:`matroot.certify.probes.FAILURE_PROBABILITY`, 1e-12, for
        ``certificate="randomized"``), and ``lambda_max`` below the true λmax
        (:data:`matroot.spectrum.lambda_max_bounds.FAILURE_PROBABILITY`, 1e-12, for
        ``bound_certificate="randomized"`` where its Lanczos run does not span
        the whole space). Only the first can make ``converged`` wrong; 0 when
        both are deterministic.
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
        return summary_line("InvRootResult", self.method, self.root, self.converged,
                            self.iterations, "residual", self.residual)


def summary_line(kind: str, method: str, root, converged, iterations, measure: str,
                 values) -> str:
    """A result's one-line repr: the method, the root's dtype and shape, how many
    converged, the step range and the worst ``measure`` (NaN ignored)."""
    converged = _xp.to_numpy(converged)
    iterations = _xp.to_numpy(iterations)
    values = _xp.to_numpy(values).astype(float)
    if iterations.size == 0:
        steps = "-"
    elif iterations.min() == iterations.max():
        steps = f"{iterations.min()}"
    else:
        steps = f"{iterations.min()}-{iterations.max()}"
    shape = ", ".join(str(d) for d in root.shape)
    return (f"{kind}(method={method!r}, root={str(root.dtype).rsplit('.', 1)[-1]}[{shape}], "
            f"converged {int(converged.sum())}/{converged.size}, iterations {steps}, "
            f"worst {measure} {_worst(values):.2g})")


def _worst(residual: np.ndarray) -> float:
    """The largest residual that is not NaN (NaN where all are; 0 for none)."""
    if residual.size == 0:
        return 0.0
    known = residual[~np.isnan(residual)]
    return float(known.max()) if known.size else float("nan")


def reshaped(xp, result, batch):
    """The flat ``(b, ...)`` fields of a result in the input's batch shape."""
    fields = {name: xp.reshape(value, batch) for name, value in result._asdict().items()
              if name not in ("root", "method", "failure_probability")}
    return result._replace(root=xp.reshape(result.root, (*batch, *result.root.shape[-2:])),
                           **fields)


def empty_result(xp, a, batch, method):
    """The result for an empty stack (no matrix, or n = 0): nothing to solve."""
    dev = _xp.device_of(a)
    real = xp.zeros(batch, dtype=a.dtype, device=dev)
    count = xp.zeros(batch, dtype=xp.int32, device=dev)
    return InvRootResult(xp.zeros(a.shape, dtype=a.dtype, device=dev), real, count,
                         xp.ones(batch, dtype=xp.bool, device=dev), real, count, method,
                         real, xp.zeros(batch, dtype=xp.bool, device=dev), real)
