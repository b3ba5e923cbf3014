"""What :func:`matroot.polar_info` returns: :class:`PolarResult`."""

from __future__ import annotations

from typing import NamedTuple

from .._typing import Array
from ..roots.result import summary_line

__all__ = ["PolarResult"]


class PolarResult(NamedTuple):
    """Result of :func:`polar_info`.

    Attributes
    ----------
    root : array, shape (..., m, n)
        The polar factor, in the input's namespace, device and dtype. Singular
        directions with σ = 0 map to zero (a partial isometry); a matrix with
        NaN or Inf entries gets NaN.
    orthogonality_defect : array, shape (...)
        ``‖QᵀQ − I‖_F`` of the returned factor (``QQᵀ`` for wide matrices),
        computed in the compute dtype; ≥ the spectral-norm defect.
    error_estimate : array, shape (...)
        ``orthogonality_defect/√min(m, n)``: a bound on the relative error
        ``‖Q − U·Vᵀ‖_F/‖U·Vᵀ‖_F`` in real arithmetic (see
        :mod:`matroot.certify.polar_accuracy` for what rounding adds).
    iterations : array, shape (...)
        Polynomial steps taken (0 for a decomposition).
    converged : array of bool, shape (...)
        The input was finite and ``error_estimate ≤ rtol``; the factor then
        meets :func:`matroot.certify.polar_accuracy.polar_error_bound`.
    matmuls : array, shape (...)
        Batched matrix products formed per matrix, scaling included and the
        final check not (each at most ``max(m, n)·min(m, n)²`` multiply-adds).
    method : str
        The method that ran (what ``"auto"`` resolved to).
    """

    root: Array
    orthogonality_defect: Array
    error_estimate: Array
    iterations: Array
    converged: Array
    matmuls: Array
    method: str

    def __repr__(self) -> str:
        """One line: the factor's dtype and shape, how many converged, the worst
        error estimate.

        Examples
        --------
        >>> import numpy as np, matroot
        >>> matroot.polar_info(np.stack([np.eye(3)] * 2))
        PolarResult(method=..., root=float64[2, 3, 3], converged 2/2, ...)
        """
        return summary_line("PolarResult", self.method, self.root, self.converged,
                            self.iterations, "error estimate", self.error_estimate)
