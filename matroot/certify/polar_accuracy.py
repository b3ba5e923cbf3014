"""What ``converged=True`` promises for :func:`matroot.polar_info`, stated once.

A polar factor ``Q`` of ``G`` (``n`` the smaller side) is *converged* when its
orthogonality defect, as a relative error bound ``‖QᵀQ − I‖_F/√n``, is at most
``rtol``. In real arithmetic an iteration that applies a polynomial ``f ≥ 0`` to
the singular values keeps ``G``'s singular vectors, and then
``|f(σ) − 1| ≤ |f(σ)² − 1|`` for every σ, so ``‖Q − U·Vᵀ‖_F ≤ ‖QᵀQ − I‖_F``:
the defect bounds the relative error. Rounding adds an error the defect cannot
see (a rotation ``Q → Q·(I + S)``, ``S`` skew), of the order of the unit
roundoff times the polar factor's condition number, ``κ = σmax/σmin`` for
square ``G``. The table below is what the tests hold every converged matrix to
against a float64 SVD oracle: ``max(rtol·slack, ROUNDING[precision]·κ)``.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["DEFAULT_RTOL", "DEFAULT_LOWER", "ROUNDING", "ERROR_SLACK",
           "METHOD_ERROR_FACTOR", "polar_error_bound"]

#: Default ``rtol`` (bound on ``‖QᵀQ − I‖_F/√n``) per precision: the compute
#: dtype, or the matmul operand dtype where one is given.
DEFAULT_RTOL = MappingProxyType({"float64": 1e-10, "float32": 1e-5,
                                 "float16": 5e-3, "bfloat16": 3e-2})
#: Default lower bound on σmin/σmax the polynomial schedules are built for (divided
#: by the σmax bound's looseness): the default call converges up to κ ≈ ``1/lower``.
DEFAULT_LOWER = MappingProxyType({"float64": 1e-7, "float32": 1e-5,
                                  "float16": 1e-3, "bfloat16": 1e-3})
#: Rounding term per unit of κ in the relative error of a converged factor: about
#: 2× the worst measured for issue 36 down to n = 2 (NumPy, torch and JAX; n = 2, 3,
#: 4, 5, 6, 8, 16, 64, square and 2n × n; log-spaced, random and clustered singular
#: values with one to n − 1 of them at σmax/κ; κ to 1e7 / 1e5 / 1e3 for float64 /
#: float32 / 16-bit; 19,000 converged factors): polar_express needed at most 0.43·u
#: (float64), 0.50·u (float32), 0.22·u (float16) and 0.23·u (bfloat16 matmuls, n = 3)
#: per κ, gram_newton_schulz less, eigh and quintic nothing beyond 2·rtol. The old
#: constants were measured at n = 64 on distinct singular values (float32 0.5·u,
#: bfloat16 0.13·u), where √n hides the rotation between tiny ones.
ROUNDING = MappingProxyType({"float64": 1e-16, "float32": 6e-8,
                             "float16": 2e-4, "bfloat16": 2e-3})
#: How far the relative error of a converged factor may exceed its ``rtol``.
ERROR_SLACK = 2.0
#: Methods whose rounding error the defect sees less of, and by how much their bound
#: is multiplied: gram_newton_schulz forms its factor as ``X·R`` from n×n iterates,
#: measured 2.5-10× the direct iteration's error at n = 256 for κ = 10 to 1e3; svd
#: rotates a cluster of tiny singular values into each other by its backward error
#: ``c·u·σmax`` (measured above: up to 1.77·u·κ in float64 and 1.68·u·κ in float32 with
#: torch at n = 64, 1.21·u·κ at n = 5; 4 × 4 with σ = (1e-3, 1e-3, 1, 1): 0.66·u·κ torch,
#: 0.72·u·κ JAX, over the old bound's 0.5·u·κ).
METHOD_ERROR_FACTOR = MappingProxyType({"gram_newton_schulz": 10.0, "svd": 4.0})


def polar_error_bound(precision: str, kappa: float, rtol: float | None = None,
                      method: str = "polar_express") -> float:
    """The relative Frobenius error ``‖Q − U·Vᵀ‖_F/√n`` a converged factor meets.

    Parameters
    ----------
    precision : str
        ``"float64"``, ``"float32"``, or the matmul dtype ``"float16"`` /
        ``"bfloat16"``.
    kappa : float
        ``σmax/σmin`` of the matrix.
    rtol : float, optional
        The ``rtol`` of the call; the precision's default when None.
    method : str
        The method that ran (:data:`METHOD_ERROR_FACTOR`).

    Examples
    --------
    >>> from matroot.certify.polar_accuracy import polar_error_bound
    >>> polar_error_bound("float64", 1e2)
    2e-10
    """
    if precision not in DEFAULT_RTOL:
        raise ValueError(f"precision={precision!r} is not one of "
                         + ", ".join(repr(p) for p in DEFAULT_RTOL))
    tol = DEFAULT_RTOL[precision] if rtol is None else rtol
    factor = METHOD_ERROR_FACTOR.get(method, 1.0)
    return factor * max(tol * ERROR_SLACK, ROUNDING[precision] * kappa)
