"""How accurate an eigh root is, decided from its eigenvalues: the error estimate
``C·κ·u_eigh/p + F·n^(1/4)·u`` (:mod:`~matroot.solvers.evd`; ``C``, ``F`` measured),
the backward error measured where an eigh is not assumed to be LAPACK's, and the
screens that send a float32 matrix to float64 before or after its eigh.
"""

from __future__ import annotations

from .. import _xp
from ..certify.accuracy import BUCKET_SLACK, KAPPA_BUCKETS, row_target, unit_roundoff
from ..certify.verify import RootCheck
from ..spectrum.krylov import power_iteration_core

__all__ = ["EIGH_ERROR_FACTOR", "FORMATION_ERROR_FACTOR", "MEASURED_ERROR_PRODUCTS",
           "MEASURED_ERROR_SAFETY", "SCREEN_MIN_N", "eigh_root_check", "eigh_is_measured",
           "measured_error", "float32_eigh_suffices", "surely_beyond_float32"]

#: ``C`` and ``F`` of the error estimate (:mod:`~matroot.solvers.evd`'s docstring), measured.
EIGH_ERROR_FACTOR = 12.0
FORMATION_ERROR_FACTOR = 6.0
#: Products :func:`measured_error` forms per matrix (float64, counted as products).
MEASURED_ERROR_PRODUCTS = 3.0
#: Factor on :func:`measured_error`'s first-order sum, for its power-step estimates
#: of spectral norms (lower estimates) and the second-order terms.
MEASURED_ERROR_SAFETY = 1.25
#: Smallest n screened by :func:`surely_beyond_float32`: from there its Cholesky
#: solve costs about a tenth of an eigh (torch CPU).
SCREEN_MIN_N = 64



def _estimated_error(kappa, n, p, eigh_unit_roundoff, unit_roundoff):
    return (EIGH_ERROR_FACTOR / p * kappa * eigh_unit_roundoff
            + FORMATION_ERROR_FACTOR * n ** 0.25 * unit_roundoff)


def eigh_root_check(lam, p, eigh_unit_roundoff, unit_roundoff) -> RootCheck:
    """Per matrix: the κ and estimated relative error of an eigh root with eigenvalues ``lam``.

    Parameters
    ----------
    lam : array, shape (b, n)
        Ascending eigenvalues of each matrix.
    p : float
        Root order.
    eigh_unit_roundoff : array, shape (b,)
        Unit roundoff of the dtype each matrix's eigh ran in.
    unit_roundoff : float
        Unit roundoff of the dtype the root was formed in.

    Returns
    -------
    RootCheck
        ``error_estimate`` is ``C·κ·u_eigh/p + F·n^(1/4)·u`` (``inf`` for a
        non-finite or non-positive spectrum, which has no real root);
        ``residual`` the relative deficit ``max(0, −λmin)/λmax``; no products
        are formed (``matmul_equivalents`` 0).

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.solvers.evd import eigh_root_check
    >>> lam = np.array([[1.0, 2.0], [-1.0, 1.0]], dtype=np.float32)
    >>> check = eigh_root_check(lam, 2, np.full(2, 2.0**-24), 2.0**-24)
    >>> check.kappa.tolist(), check.positive.tolist(), bool(np.isinf(check.error_estimate[1]))
    ([2.0, inf], [True, False], True)
    """
    xp = _xp.array_namespace(lam)
    n = lam.shape[-1]
    smallest, largest = lam[:, 0], lam[:, -1]
    positive = xp.all(xp.isfinite(lam), axis=-1) & (smallest > 0)
    kappa = xp.where(positive, largest / xp.where(positive, smallest, xp.ones_like(smallest)),
                     xp.full_like(smallest, float("inf")))
    estimate = _estimated_error(kappa, n, p, xp.astype(eigh_unit_roundoff, lam.dtype),
                                unit_roundoff)
    estimate = xp.where(positive, estimate, xp.full_like(estimate, float("inf")))
    scale = xp.max(xp.abs(lam), axis=-1)
    scale = xp.where(scale > 0, scale, xp.ones_like(scale))
    deficit = xp.maximum(-smallest, xp.zeros_like(smallest)) / scale
    return RootCheck(deficit, estimate, positive, kappa, 0.0)


def eigh_is_measured(xp, a) -> bool:
    """Whether ``a``'s eigh is one ``C`` was measured on: LAPACK on a CPU (NumPy, torch,
    JAX and array-api-strict there); on an accelerator its error is measured per call."""
    return not _xp.is_accelerator(xp, a)


def measured_error(a, lam, q, p):
    """Per matrix: the relative error of the root from the eigenpairs ``(λ, Q)`` of
    ``a``, estimated from their measured backward error.

    With ``R = AQ − QΛ`` and ``G = QᵀQ − I`` formed in float64 (``a``'s dtype where
    the backend has none), ``Q·f(Λ)·Qᵀ`` is ``f`` of a matrix within ``‖R‖₂`` of
    ``a`` (up to ``G``'s share), to which the root ``f(a) = a^(-1/p)`` responds by
    at most ``κ·‖R‖₂/(p·λmax)`` relative (first order: f's divided differences are
    at most ``|f'(λmin)|``); a non-orthogonal ``Q`` adds ``‖G‖₂``. Both spectral
    norms come from a few power steps (a lower estimate, sharp for the dominant
    direction a faulty eigh leaves), so the sum is taken
    :data:`MEASURED_ERROR_SAFETY` times. Three products per matrix, in float64.
    (LAPACK's float32 eighs give ``‖R‖₂`` of 5 to 26 ``u·λmax`` for n = 8 to 512,
    so this is 0.5 to 2.7 times the a-priori estimate there.)

    Parameters
    ----------
    a : array, shape (b, n, n)
        The decomposed matrices, in the dtype the eigh ran in.
    lam, q : arrays, shapes (b, n) and (b, n, n)
        Ascending eigenvalues and eigenvectors the eigh returned.
    p : float
        Root order.

    Returns
    -------
    array, shape (b,)
        In ``lam``'s dtype; ``inf`` where λ is not all positive and finite.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.solvers.evd import measured_error
    >>> a = np.diag([1.0, 4.0])[None]
    >>> exact = measured_error(a, np.array([[1.0, 4.0]]), np.eye(2)[None], 2)
    >>> tilted = measured_error(a, np.array([[1.0, 4.0]]),
    ...                         np.array([[[1.0, 1e-3], [-1e-3, 1.0]]]), 2)
    >>> float(exact[0]), bool(1e-3 < tilted[0] < 1e-2)
    (0.0, True)
    """
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    wide = xp.float64 if _xp.has_float64(xp) else a.dtype
    a_w, q_w, lam_w = (xp.astype(v, wide) for v in (a, q, lam))
    scale = xp.max(xp.abs(lam_w), axis=-1)
    positive = xp.all(xp.isfinite(lam_w), axis=-1) & (lam_w[:, 0] > 0)
    scale = xp.where(positive, scale, xp.ones_like(scale))
    misfit = a_w @ q_w - q_w * lam_w[:, None, :]
    eye = _xp.identity_stack(xp, n, wide, _xp.device_of(a))
    skew = xp.matrix_transpose(q_w) @ q_w - eye
    misfit_2 = xp.sqrt(power_iteration_core(xp.matrix_transpose(misfit) @ misfit))
    kappa = scale / xp.where(positive, lam_w[:, 0], xp.ones_like(scale))
    bound = MEASURED_ERROR_SAFETY * (kappa * misfit_2 / (p * scale)
                                     + power_iteration_core(skew))
    bound = xp.where(positive & xp.isfinite(bound), bound, xp.full_like(bound, float("inf")))
    return xp.astype(bound, lam.dtype)


def float32_eigh_suffices(lam, p, tol: float = 0.0, measured=None):
    """Per matrix: whether a float32 eigh with eigenvalues ``lam`` meets the table (or ``tol``).

    Parameters
    ----------
    lam : array, shape (b, n)
        Ascending float32 eigenvalues of each matrix.
    p : float
        Root order.
    tol : float
        A requested relative error looser than the table's, if any: what
        ``converged`` then promises (:func:`matroot.inv_root_info`).
    measured : array, shape (b,), optional
        The :func:`measured_error` of the eigenpairs, where measured: the
        larger of it and the a-priori estimate is judged.

    Returns
    -------
    array of bool, shape (b,)
        False for non-finite or non-positive spectra, and where the estimated
        error (:func:`eigh_root_check`) exceeds both the table's entry for κ and
        ``tol``.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.solvers.evd import float32_eigh_suffices
    >>> lam = np.array([[1.0, 2.0], [1e-4, 1.0]], dtype=np.float32)
    >>> float32_eigh_suffices(lam, 2).tolist(), float32_eigh_suffices(lam, 2, 1e-2).tolist()
    ([True, False], [True, True])
    """
    xp = _xp.array_namespace(lam)
    u = unit_roundoff(xp, xp.float32)
    check = eigh_root_check(lam, p, xp.full(lam.shape[:1], u, dtype=lam.dtype,
                                            device=_xp.device_of(lam)), u)
    target = row_target("evd", "float32", p, check.kappa)
    estimate = check.error_estimate if measured is None else xp.maximum(
        check.error_estimate, measured)
    return estimate <= xp.maximum(target, xp.full_like(target, tol))


def surely_beyond_float32(a, p, tol: float = 0.0):
    """Per matrix: whether κ is surely too large for a float32 eigh to meet ``max(table, tol)``.

    A lower bound on κ from one inverse-iteration step: ``λmax ≥ max aᵢᵢ`` and
    ``λmin ≤ xᵀy/yᵀy``, the Rayleigh quotient of ``y = A⁻¹x``. Where even the
    table's loosest target (or ``tol``) is out of reach at that κ, the float32
    eigh would be wasted; a matrix whose float32 Cholesky fails (torch) is
    hopeless too. It costs one Cholesky (LU elsewhere) solve per matrix, so
    stacks with n < :data:`SCREEN_MIN_N` are not screened, nor a stack the solve
    rejects (all False): a wrong answer here costs time, never accuracy.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.solvers.evd import surely_beyond_float32
    >>> lam = np.geomspace(1.0, 1e-8, 64)
    >>> surely_beyond_float32(np.stack([np.eye(64), np.diag(lam)]), 2).tolist()
    [False, True]
    """
    xp = _xp.array_namespace(a)
    b, n = a.shape[0], a.shape[-1]
    dev = _xp.device_of(a)
    never = xp.zeros((b,), dtype=xp.bool, device=dev)
    if n < SCREEN_MIN_N:
        return never
    # A fixed start with weight on every eigenvector of a generic matrix.
    start = 1.0 + 0.5 * xp.cos(2.4 * xp.arange(n, dtype=a.dtype, device=dev))
    try:
        y = _xp.spd_solve(a, xp.broadcast_to(start[:, None], (b, n, 1)))[..., 0]
    except Exception:  # LinAlgError differs per backend
        return never
    quotient = xp.sum(start * y, axis=-1) / xp.sum(y * y, axis=-1)
    usable = xp.isfinite(quotient) & (quotient > 0)
    top = xp.max(xp.linalg.diagonal(a), axis=-1)
    kappa = top / xp.where(usable, quotient, xp.ones_like(quotient))
    u = unit_roundoff(xp, xp.float32)
    # κ may be anywhere above the bound: float32 must fail at the bound and at the
    # start of every looser bucket of the table above it (the estimate grows with κ).
    missed_everywhere = xp.ones_like(usable)
    for edge in (0.0, *KAPPA_BUCKETS):
        at = xp.maximum(kappa, xp.full_like(kappa, edge * BUCKET_SLACK * (1 + 1e-6)))
        target = row_target("evd", "float32", p, at)
        reachable = xp.maximum(target, xp.full_like(target, tol))
        missed_everywhere = missed_everywhere & (_estimated_error(at, n, p, u, u) > reachable)
    return ~usable | missed_everywhere
