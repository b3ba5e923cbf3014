"""Inverse p-th roots from the symmetric eigendecomposition, any real p > 0.

One eigh per matrix, and no spectral scaling (eigh needs none). The root checks
itself from its eigenvalues instead of forming products (which in float32 cannot
resolve errors below about ``n·u·κ^(2/p)`` anyway): an eigh is backward stable,
its eigenpairs exact for ``A + E`` with ``‖E‖ ≲ c·u·λmax``, and the p-th root's
relative response to such an E is at most ``‖E‖/(p·λmin)``, so the root's
relative error is about ``C·κ·u_eigh/p`` (``u_eigh`` the unit roundoff the eigh
ran in) plus the rounding of forming ``Q diag(λ^(-1/p)) Qᵀ`` in the compute
dtype, ``F·n^(1/4)·u``. ``C = 12`` and ``F = 6`` bound every float32 eigh root
measured with torch/MKL (n = 4 to 512, κ = 10 to 1e6, p = 1, 2, 4, all of
:data:`matroot.testing.FAMILIES`) with a margin of 1.4 where the estimate is
≤ 2e-4. A float32 stack is solved by a float32 eigh; the matrices whose
estimate misses the README's float32 accuracy table are solved again in float64
(as Distributed Shampoo retries failed eighs), alone, so the others keep their
bits and a well-conditioned stack costs one float32 eigh. Backends whose float32
eigh runs in float64 anyway (NumPy) never retry.

``C`` was measured on LAPACK's eighs (CPUs). A GPU eigh (cuSOLVER through torch
or CuPy, JAX's own) is not assumed to share it — JAX's float32 GPU eigh missed
the table by 3× at κ = 100 — so there each decomposition's backward error is
measured instead (:func:`measured_error`, three products in float64), and the
check takes the larger of the two estimates.
"""

from __future__ import annotations

from .. import _xp
from ..certify.accuracy import BUCKET_SLACK, KAPPA_BUCKETS, row_target, unit_roundoff
from ..spectrum.krylov import power_iteration_core
from ..certify.verify import RootCheck
from ._result import SolverOutput
from .registry import ANY_REAL_P, SolverSpec

#: ``C`` and ``F`` of the error estimate (module docstring), measured.
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


def _eigh_or_none(xp, a):
    try:
        return _xp.lapack_in_order(xp.linalg.eigh, a)
    except Exception:  # LinAlgError differs per backend; the retry handles all.
        return None


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


def _root_from_eigh(xp, lam, q, p, dtype=None):
    """``Q·diag(λ^(-1/p))·Qᵀ``, its product formed in ``dtype`` (default: q's)."""
    safe = xp.where(lam > 0, lam, xp.ones_like(lam))
    entries = _xp.inverse_root_entries(safe, p)
    if dtype is not None:
        q, entries = xp.astype(q, dtype), xp.astype(entries, dtype)
    return (q * entries[:, None, :]) @ xp.matrix_transpose(q)


def _with_ridge(xp, a, ridge, dtype):
    """``a + ridge·I`` formed in ``dtype`` (the dtype the eigh runs in): a ridge added
    in float32 before a float64 eigh would round ``A + eps·I`` to float32 first."""
    wide = xp.astype(a, dtype, copy=False)
    if ridge is None:
        return wide
    return _xp.add_scaled_identity(wide, xp.astype(ridge, dtype))


def _all_in_float64(xp, a, p, ridge=None, measure=False):
    """Eigenvalues and roots of the whole stack ``a`` from a float64 eigh, in a's dtype.

    The eigenpairs are float64-accurate; the root is formed from them rounded to
    a's dtype (the formation term ``F·n^(1/4)·u`` of the check, in a's u), which
    costs one product in a's dtype instead of one in float64 (half the time on a
    CPU, the largest cost of the retry after the eigh itself). With ``measure``,
    also the :func:`measured_error` of each (else None)."""
    widened = _with_ridge(xp, a, ridge, xp.float64)
    wide = _eigh_or_none(xp, widened)
    if wide is None:
        raise ValueError("eigh failed on this stack, also in float64")
    lam = xp.astype(wide.eigenvalues, a.dtype)
    error = (xp.astype(measured_error(widened, wide.eigenvalues, wide.eigenvectors, p), a.dtype)
             if measure else None)
    return lam, _root_from_eigh(xp, wide.eigenvalues, wide.eigenvectors, p, a.dtype), error


def _retry_in_float64(xp, a, lam, root, redo, p, ridge=None, error=None):
    """Eigenvalues and roots of ``a`` with the ``redo`` matrices solved in float64;
    with a measured ``error`` per matrix, also that of the redone ones in its place."""
    picked = xp.nonzero(redo)[0]
    wide_lam, wide_root, wide_error = _all_in_float64(
        xp, xp.take(a, picked, axis=0), p,
        None if ridge is None else xp.take(ridge, picked, axis=0), measure=error is not None)
    if picked.shape[0] == a.shape[0]:
        return wide_lam, wide_root, wide_error  # all redone: nothing to merge
    # Matrix i of the stack takes row position[i] of the float64 results where redone.
    position = xp.cumulative_sum(xp.astype(redo, xp.int64)) - 1
    position = xp.clip(position, 0, picked.shape[0] - 1)
    lam = xp.where(redo[:, None], xp.take(wide_lam, position, axis=0), lam)
    root = _xp.batched_where(redo, xp.take(wide_root, position, axis=0), root)
    if error is not None:
        error = xp.where(redo, xp.take(wide_error, position, axis=0), error)
    return lam, root, error


def evd(a, p, *, tol: float = 0.0, float64_retry: bool = True, ridge=None, **_):
    """``a^(-1/p) = Q diag(λ^(-1/p)) Qᵀ`` from one ``eigh`` per matrix.

    Matrices with an eigenvalue ≤ 0 (singular or indefinite: there is no real
    inverse root) come back as NaN with ``converged=False``. For float32 input,
    matrices whose float32 eigh failed, came back non-finite or cannot meet the
    accuracy table (:func:`float32_eigh_suffices`), nor a looser ``tol``, are
    solved again in float64 when ``float64_retry``.

    Parameters
    ----------
    a : array, shape (b, n, n)
        Symmetric stack (any scale).
    p : float
        Root order, > 0.
    ridge : array, shape (b,), optional
        Added to the diagonal in the dtype each eigh runs in (float64 for the
        retried matrices), so the roots are of ``a + ridge·I``.

    Returns
    -------
    SolverOutput
        ``residual`` is the relative deficit ``max(0, -λmin) / λmax`` (0 for SPD);
        ``lambda_max`` the largest eigenvalue; ``check`` the root's own
        :func:`eigh_root_check` (no products are formed to check it).

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
    dev = _xp.device_of(a)
    traced = _xp.is_traced(a)
    # JAX without x64 has no float64: no matrix is retried (the check still says
    # which ones fell short). Under tracing nothing can be read back to pick the
    # matrices to retry, so the whole stack is decomposed in float64.
    widen = a.dtype == xp.float32 and float64_retry and _xp.has_float64(xp)
    narrow = widen and not traced
    eigh_dtype = xp.float64 if _xp.eigh_runs_in_float64(xp) else a.dtype
    eigh_unit = xp.full((b,), unit_roundoff(xp, eigh_dtype), dtype=a.dtype, device=dev)
    wide_unit = xp.full_like(eigh_unit, unit_roundoff(xp, xp.float64))
    screened = narrow and eigh_dtype == xp.float32
    measure = not eigh_is_measured(xp, a)
    error = None  # measured error bound per matrix, where measured
    plain = a
    a = _with_ridge(xp, a, ridge, eigh_dtype)
    beyond = surely_beyond_float32(a, p, tol) if screened else None
    # Where every matrix surely needs float64, the float32 eigh is skipped.
    skip = (widen and traced) or (beyond is not None and bool(xp.all(beyond)))
    widened = False  # some root formed from float64 eigenpairs rounded to plain's dtype
    decomposition = None if skip else _eigh_or_none(xp, a)
    if decomposition is None and widen:
        # The float32 call failed or was skipped: every matrix in float64.
        lam, root, error = _all_in_float64(xp, plain, p, ridge, measure=measure)
        eigh_unit = wide_unit
        widened = True
    elif decomposition is None:
        raise ValueError("eigh failed on this stack")
    else:
        lam, q = decomposition
        if measure:
            error = xp.astype(measured_error(a, lam, q, p), plain.dtype)
        lam, root = xp.astype(lam, plain.dtype), xp.astype(_root_from_eigh(xp, lam, q, p),
                                                             plain.dtype)
    if decomposition is not None and beyond is not None:
        # The screened ones too, so a matrix's bits never depend on its neighbours.
        redo = ~float32_eigh_suffices(lam, p, tol, error) | beyond
        if bool(xp.any(redo)):
            lam, root, error = _retry_in_float64(xp, plain, lam, root, redo, p, ridge, error)
            eigh_unit = xp.where(redo, wide_unit, eigh_unit)
            widened = True
    # The root is formed in the eigh's dtype (float64 for NumPy's), then rounded
    # once to the stack's: at most one unit roundoff of it per entry (twice that
    # covers the comparison with an oracle rounded the same way). Roots from the
    # float64 retry are formed in the stack's dtype.
    formed_in = unit_roundoff(xp, eigh_dtype if not widened else plain.dtype)
    check = eigh_root_check(lam, p, eigh_unit, formed_in)
    if eigh_dtype != plain.dtype:
        check = check._replace(error_estimate=check.error_estimate
                               + 2 * unit_roundoff(xp, plain.dtype))
    if error is not None:  # a GPU's eigh: its measured error where that is larger
        check = check._replace(error_estimate=xp.maximum(check.error_estimate, error),
                               matmul_equivalents=MEASURED_ERROR_PRODUCTS)
    # A root beyond the compute dtype's range (a tiny eigenvalue, a small p) stays
    # non-finite: the caller judges the returned root's range (and warns of it).
    if traced or not bool(xp.all(check.positive)):
        root = _xp.batched_where(check.positive, root, xp.full_like(root, float("nan")))
    zeros = xp.zeros((b,), dtype=xp.int32, device=dev)
    check = check._replace(residual=xp.astype(check.residual, plain.dtype))
    return SolverOutput(root, check.residual, zeros, check.positive, zeros,
                        xp.max(lam, axis=-1), check)


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
    accuracy_row="evd",
)
