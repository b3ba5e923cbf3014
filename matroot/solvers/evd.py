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

import functools

from .. import _xp
from ..certify.accuracy import unit_roundoff
from ._result import SolverOutput
from .evd_accuracy import (
    MEASURED_ERROR_PRODUCTS,
    eigh_is_measured,
    eigh_root_check,
    float32_eigh_suffices,
    measured_error,
    surely_beyond_float32,
)
from .registry import ANY_REAL_P, SolverSpec


def _eigh_or_none(xp, a):
    try:
        return _xp.lapack_in_order(xp.linalg.eigh, a)
    except Exception:  # LinAlgError differs per backend; the retry handles all.
        return None


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


def _merge_float64(xp, a, redo, p, ridge, lam, root, error):
    """``(lam, root, error)`` with the ``redo`` matrices' from a float64 eigh of the
    whole stack ``a`` (traced: the picked matrices' count is not a shape)."""
    wide_lam, wide_root, wide_error = _all_in_float64(xp, a, p, ridge,
                                                      measure=error is not None)
    return (xp.where(redo[:, None], wide_lam, lam), _xp.batched_where(redo, wide_root, root),
            None if error is None else xp.where(redo, wide_error, error))


def evd(a, p, *, tol: float = 0.0, float64_retry: bool = True, ridge=None,
        eager_program: bool = False, **_):
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
    eager_program : bool
        Traced as an eager call's one compiled program
        (:func:`matroot.roots.call.compiled_call`): the float32 screen and retry
        decide on the device as they do eagerly on the host, the retry a branch
        (``lax.cond``) that decomposes the whole stack in float64 and keeps the
        redone matrices only, so every matrix gets the bits it gets eagerly.

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
    narrow = widen and (not traced or eager_program)
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
    skip = (widen and not narrow) or (beyond is not None and not traced
                                      and bool(xp.all(beyond)))
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
        if traced:
            lam, root, error = _xp.cond(xp.any(redo), functools.partial(
                _merge_float64, xp, plain, redo, p, ridge), lambda *kept: kept, lam, root, error)
            eigh_unit = xp.where(redo, wide_unit, eigh_unit)
            widened = True
        elif bool(xp.any(redo)):
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
