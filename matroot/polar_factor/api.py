"""The polar factor ``polar(G) = G·(GᵀG)^(-1/2) = U·Vᵀ`` of every matrix of a stack.

The call is resolved once on the host (method, precision, tolerance and the
polynomial steps, which depend only on those), then one pass runs without a
data-dependent loop: validate → transpose wide matrices (the iteration works on
the smaller Gram side) → scale by a proven bound on σmax → iterate → check
the returned factor's orthogonality defect. Its only host reads are the
certified bound's (eagerly, outside the iteration); under ``jax.jit`` and
``torch.compile`` there are none.

The module is ``matroot.polar_factor.api`` so that ``matroot.polar`` is only ever the
function (a module of that name would be shadowed by it).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from .. import _xp
from .._checks import (check_choice, check_flag, check_matmul_dtype, check_max_iter,
                      check_nonnegative, check_stack)
from .._typing import Array
from ..certify.accuracy import check_rtol, unit_roundoff
from ..certify.polar_accuracy import DEFAULT_LOWER, DEFAULT_RTOL
from ..solvers.polar.coefficients import band_lower, default_margin
from .gradient import polar_derivative
from .result import PolarResult
from ..solvers.polar import get_polar_method, polar_method_names
from ..roots.api import ConvergenceWarning
from ..spectrum.scaling import certified_lambda_max

__all__ = ["polar", "polar_info", "PolarResult", "SIGMA_BOUNDS", "GRAM_NORM_MAX_N",
           "sigma_bound_looseness"]

#: ``sigma_bound`` choices. ``"auto"`` is the method's own bound where its registry
#: entry names one (``PolarMethod.sigma_bound``), else ``"gram_norm"`` where it adds no step to
#: the schedule (always under Muon's step cap) or the smaller side is at most
#: :data:`GRAM_NORM_MAX_N`, ``"cholesky"`` otherwise.
SIGMA_BOUNDS = ("auto", "gram_norm", "cholesky")
#: Largest smaller side for which ``"auto"`` takes ``"gram_norm"`` even when its
#: looseness costs a step (3 products): measured (``python -m bench polar``, torch CPU,
#: float32, docs/polar.rst) the Cholesky certificate costs more time than that step
#: at n = 64 (time ratio 0.83-0.95 at 16×64², 0.95-0.97 at 16×256×64), less from
#: n = 128 (1.04-1.18 at 8×2048×128).
GRAM_NORM_MAX_N = 64


def sigma_bound_looseness(n: int, sigma_bound: str | None) -> float:
    """The most a bound ``s`` may exceed σmax, as ``s ≤ ρ·σmax``, for n×n Gram matrices.

    The schedule is built for ``lower/ρ``: with ``σmax ≤ s ≤ ρ·σmax`` every σ/s
    lies in ``[σmin/(ρ·σmax), 1] ⊇ [lower/ρ, 1]`` whenever ``σmin/σmax ≥ lower``,
    so ``lower`` keeps its meaning (a bound on σmin/σmax) whatever the bound.
    ``"gram_norm"``: ``ρ = n^(1/8)`` (all σ equal to σmax but one); ``"cholesky"``:
    1 (its 5 % safety on σmax² is inside the schedule's cushion, as before).

    Examples
    --------
    >>> from matroot.polar_factor.api import sigma_bound_looseness
    >>> sigma_bound_looseness(256, "gram_norm"), sigma_bound_looseness(256, "cholesky")
    (2.0, 1.0)
    """
    return float(n) ** 0.125 if sigma_bound == "gram_norm" else 1.0


def _default_rtol(xp, dtype, precision: str) -> float:
    """The precision's default ``rtol``, or a 16-bit input's where that is looser: the
    factor returned in 16 bits carries a defect of its own rounding (about its unit
    roundoff), which float32's default could never meet."""
    for name in ("float16", "bfloat16"):
        try:
            sixteen_bit = _xp.dtype_from_name(xp, name)
        except ValueError:  # the backend has no such dtype
            continue
        if dtype == sixteen_bit:
            return max(DEFAULT_RTOL[precision], DEFAULT_RTOL[name])
    return DEFAULT_RTOL[precision]


def _resolve(xp, g, method, rtol, max_iter, matmul_dtype, lower, sigma_bound):
    """The call's static decisions: method, compute dtype, rtol, σmax bound and the
    step rows."""
    if method == "auto":
        method = "polar_express"
    polar_method = get_polar_method(method)
    work_name = _xp.work_dtype_name(xp, g.dtype)
    matmul_dtype = check_matmul_dtype(xp, matmul_dtype, work_name)
    precision = (matmul_dtype if matmul_dtype is not None and polar_method.forms_products
                 else work_name)
    unit = unit_roundoff(xp, _xp.dtype_from_name(xp, precision))
    if rtol is None:
        rtol = _default_rtol(xp, g.dtype, precision)
    else:
        rtol = check_rtol(rtol, unit, result="polar factor",
                          remedy=f"float64 input (this one computes in {precision})")
    if lower is None:
        lower = DEFAULT_LOWER[precision]
    elif not 0.0 < check_nonnegative(lower, "lower") < 1.0:
        raise ValueError(f"lower must lie in (0, 1) (a bound on σmin/σmax), got {lower!r}")
    # An empty matrix is not solved, but its call's options are checked all the same.
    n = max(min(g.shape[-2:]), 1)
    max_iter = check_max_iter(max_iter)

    def rows_for(bound):
        # The schedule aims below rtol, leaving the rest of it to rounding.
        return _step_rows(method, _schedule_lower(float(lower), n, bound, max_iter),
                          max(rtol / 4, unit), default_margin(unit), max_iter)

    if polar_method.scaling != "certified":
        return method, work_name, rtol, None, rows_for(None)
    if sigma_bound == "auto" and polar_method.sigma_bound is not None:
        sigma_bound = polar_method.sigma_bound
    if sigma_bound != "auto":
        return method, work_name, rtol, sigma_bound, rows_for(sigma_bound)
    rows = rows_for("gram_norm")
    if n <= GRAM_NORM_MAX_N or len(rows) == len(rows_for("cholesky")):
        return method, work_name, rtol, "gram_norm", rows
    return method, work_name, rtol, "cholesky", rows_for("cholesky")


def _schedule_lower(lower: float, n: int, sigma_bound: str | None,
                    max_iter: int | None) -> float:
    """The ℓ of the schedule: ``lower/ρ`` (:func:`sigma_bound_looseness`), but under a
    step cap k never below ``min(lower, band_lower(k))``: k steps bring nothing below
    ``band_lower(k)`` within ``MUON_BAND`` of 1, and building for less only widens
    the band of every σ above it (measured: 0.53 against 0.28 at n = 64, κ = 10)."""
    looser = lower / sigma_bound_looseness(n, sigma_bound)
    if max_iter is None or looser == lower:
        return looser
    return max(looser, min(lower, band_lower(max_iter)))


@_xp.host_constant
def _step_rows(method, lower, target, margin, max_iter):
    """The method's ``(c1, c3, c5)`` rows as Python floats: a constant torch.compile
    bakes in (instead of tracing the Remez exchange)."""
    return get_polar_method(method).steps(lower, target, margin, max_iter)


def polar_info(g: Array, /, *, method: str = "auto", rtol: float | None = None,
               max_iter: int | None = None, matmul_dtype: str | None = None,
               check_finite: bool = True, lower: float | None = None,
               sigma_bound: str = "auto") -> PolarResult:
    """:func:`polar` with per-matrix diagnostics.

    Takes the same arguments as :func:`polar`.

    Returns
    -------
    PolarResult
        ``root`` plus per-matrix ``orthogonality_defect``, ``error_estimate``,
        ``iterations``, ``converged`` and ``matmuls`` of shape ``g.shape[:-2]``.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> g = np.array([[[3.0, 0.0], [0.0, -0.5], [0.0, 0.0]]])
    >>> res = matroot.polar_info(g)
    >>> np.round(res.root[0], 6).tolist(), res.converged.tolist()
    ([[1.0, 0.0], [0.0, -1.0], [0.0, 0.0]], [True])
    """
    xp = check_stack(g, "g", square=False)
    _xp.refuse_torch_func(g, "polar")
    check_choice(method, "method", polar_method_names())
    check_choice(sigma_bound, "sigma_bound", SIGMA_BOUNDS)
    check_finite = check_flag(check_finite, "check_finite")
    method, work_name, rtol, sigma_bound, rows = _resolve(
        xp, g, method, rtol, max_iter, matmul_dtype, lower, sigma_bound)
    # A decomposition (no polynomial steps) has a backward that divides by singular-value
    # gaps (NaN for an orthonormal g): it runs untracked and gets the exact derivative.
    attach = not rows and math.prod(g.shape) > 0 and _xp.gradient_flows(g)
    differentiated, g = g, _xp.without_gradient(g) if attach else g
    result = _polar_info(xp, g, method, work_name, rtol, sigma_bound, rows, matmul_dtype,
                         check_finite)
    if not attach:
        return result
    return result._replace(root=_xp.with_gradient(differentiated, result.root,
                                                  polar_derivative))


def _polar_info(xp, g, method, work_name, rtol, sigma_bound, rows, matmul_dtype,
                check_finite) -> PolarResult:
    """The body of :func:`polar_info` after its arguments are resolved."""
    batch = tuple(g.shape[:-2])
    if math.prod(batch) == 0 or min(g.shape[-2:]) == 0:
        return _empty_result(xp, g, batch, method)
    static = dict(method=method, rows=rows, rtol=rtol, matmul_dtype=matmul_dtype,
                  work_name=work_name, sigma_bound=sigma_bound)
    traced = _xp.is_traced(g)
    if _xp.is_jax_namespace(xp):
        _xp.register_jax_pytree(PolarResult, ("method",))
    if check_finite and not traced and not bool(xp.all(xp.isfinite(g))):
        raise ValueError("g contains NaN or Inf (pass check_finite=False to get NaN factors "
                         "for those matrices instead)")
    if _xp.is_jax_namespace(xp) and not traced:
        # One compiled call per shape instead of hundreds of eagerly dispatched ops.
        return _xp.jax_compiled(_polar_stack, g, **static)
    with _xp.solve_context(xp, g):
        return _polar_stack(g, **static)


def _scaled(x, gram, scaling: str, sigma_bound: str | None, matmul):
    """``x``, its Gram matrix and (for ``"gram_norm"``) the Gram matrix's square,
    divided so that every σ ≤ 1 (``"certified"``, by ``sigma_bound``) or
    ``‖x‖_F = 1`` (``"frobenius"``); a zero matrix keeps scale 1."""
    xp = _xp.array_namespace(x)
    gram_squared = None
    if scaling == "frobenius":
        square = _xp.frobenius_norm(x) ** 2
    elif sigma_bound == "cholesky":
        square = certified_lambda_max(_xp.symmetric_part(gram)).bound
    elif sigma_bound == "gram_norm":
        # The product the first step needs anyway: σmax⁴ ≤ ‖A²‖_F (module docstring);
        # the margin covers the rounding of the sum of squares.
        gram_squared = matmul(gram, gram)
        unit = unit_roundoff(xp, x.dtype)
        square = xp.sqrt(_xp.frobenius_norm(gram_squared) * (1 + 2 * (x.shape[-1] + 2) * unit))
    else:
        return x, gram, None
    square = xp.where(square > 0, square, xp.ones_like(square))
    if gram_squared is not None:
        gram_squared = gram_squared / (square ** 2)[:, None, None]
    return x / xp.sqrt(square)[:, None, None], gram / square[:, None, None], gram_squared


def _polar_stack(g, *, method, rows, rtol, matmul_dtype, work_name, sigma_bound):
    """The resolved call on a non-empty stack (pure: traceable by jax.jit)."""
    xp = _xp.array_namespace(g)
    polar_method = get_polar_method(method)
    batch, (m, n) = tuple(g.shape[:-2]), g.shape[-2:]
    b = math.prod(batch)
    work = getattr(xp, work_name)
    stack = xp.reshape(xp.astype(g, work, copy=False), (b, m, n))
    wide = m < n
    if wide:
        stack = xp.matrix_transpose(stack)
    finite = _xp.finite_matrices(stack)
    stack = _xp.batched_where(finite, stack, xp.zeros_like(stack))
    # Entries O(1) before any product: ‖G‖² overflows float32 from entries of 1e19 on.
    entry = xp.max(xp.abs(stack), axis=(-2, -1))
    x = stack / xp.where(entry > 0, entry, xp.ones_like(entry))[:, None, None]
    matmul = _xp.Matmul(xp, None if matmul_dtype is None or not polar_method.forms_products
                        else _xp.dtype_from_name(xp, matmul_dtype))
    gram = None
    if polar_method.scaling != "none" or polar_method.forms_products:
        gram = matmul.full(xp.matrix_transpose(x), x)
    x, gram, gram_squared = _scaled(x, gram, polar_method.scaling, sigma_bound, matmul)
    if gram_squared is None:
        factor = polar_method.solve(x, gram, rows, matmul)
    else:
        factor = polar_method.solve(x, gram, rows, matmul, gram_squared=gram_squared)
    returned = xp.astype(factor, g.dtype, copy=False)
    # The defect of what the caller gets, so the cast back is in it.
    returned_in_work = xp.astype(returned, work, copy=False)
    n_side = returned_in_work.shape[-1]
    eye = _xp.identity_stack(xp, n_side, work, _xp.device_of(returned_in_work))
    defect = _xp.frobenius_norm(_xp.add_product(
        eye, xp.matrix_transpose(returned_in_work), returned_in_work, beta=-1.0))
    nan = xp.full_like(defect, float("nan"))
    defect = xp.where(finite, defect, nan)
    error = defect / math.sqrt(n_side)
    converged = finite & (error <= rtol)
    returned = _xp.batched_where(finite, returned, xp.full_like(returned, float("nan")))
    if wide:
        returned = xp.matrix_transpose(returned)
    count = xp.full(defect.shape, 1, dtype=xp.int32, device=_xp.device_of(defect))
    return PolarResult(
        root=xp.reshape(returned, (*batch, *returned.shape[-2:])),
        orthogonality_defect=xp.reshape(defect, batch),
        error_estimate=xp.reshape(error, batch),
        iterations=xp.reshape(count * len(rows), batch),
        converged=xp.reshape(converged, batch),
        matmuls=xp.reshape(count * matmul.count, batch),
        method=method,
    )


def _empty_result(xp, g, batch, method):
    """An empty stack or empty matrices: nothing to orthogonalize."""
    dev = _xp.device_of(g)
    zeros = xp.zeros(batch, dtype=g.dtype, device=dev)
    counts = xp.zeros(batch, dtype=xp.int32, device=dev)
    return PolarResult(xp.zeros_like(g), zeros, zeros, counts,
                       xp.ones(batch, dtype=xp.bool, device=dev), counts, method)


def polar(g: Array, /, **options: Any) -> Array:
    """Orthogonal polar factor ``U·Vᵀ`` of every matrix of a stack ``g[..., m, n]``.

    Parameters
    ----------
    g : array, shape (..., m, n)
        Real floating matrices of any shape (tall, wide or square) from NumPy,
        PyTorch, JAX, CuPy or array-api-strict. float16/bfloat16 inputs are
        computed in float32, float64 in float64.
    method : {"auto", "polar_express", "gram_newton_schulz", "rms_quintic", "quintic", "svd", \
              "eigh"}
        See :data:`matroot.solvers.polar.POLAR_METHODS`; ``"auto"`` is
        ``"polar_express"``.
    rtol : float, optional
        Bound on ``‖QᵀQ − I‖_F/√min(m, n)`` for ``converged``, at least 10 unit
        roundoffs of the precision (a smaller one, 0 included, no factor could
        meet: ValueError); default per
        precision in :data:`matroot.certify.polar_accuracy.DEFAULT_RTOL`, for a float16 or
        bfloat16 input that dtype's (the factor returned in 16 bits carries its
        rounding, which float32's default could not meet).
    max_iter : int, optional
        Cap on the polynomial steps (the quintic's step count). A cap below what
        ``lower`` needs is best paired with
        ``lower=matroot.solvers.polar.coefficients.band_lower(max_iter)``, the widest
        interval those steps bring near 1 (Muon's default: 4 steps, ``lower=3.3e-3``).
    matmul_dtype : {None, "float16", "bfloat16"}
        Round the operands of every product to this dtype (float32 accumulation);
        the schedule then keeps the 1.01 safety factor.
    check_finite : bool
        Raise ValueError on NaN/Inf input (eagerly); with False those matrices
        get NaN factors and their neighbours are unaffected.
    lower : float, optional
        The smallest σmin/σmax the polynomial schedules are built for
        (:data:`matroot.certify.polar_accuracy.DEFAULT_LOWER` per precision); smaller
        singular values are not mapped to 1 and leave ``converged`` False.
        The schedule is built for ``lower/ρ``, ρ the looseness of the σmax bound
        (:func:`sigma_bound_looseness`).
    sigma_bound : {"auto", "gram_norm", "cholesky"}
        The proven σmax bound the polynomial methods scale by (module docstring):
        ``"gram_norm"`` (no product, at most ``n^(1/8)`` above σmax) or
        ``"cholesky"`` (within 2.5 %, a power iteration and Cholesky tests);
        ``"auto"`` takes the method's own bound where its registry entry names one
        (``"rms_quintic"``: ``"cholesky"``), else ``"gram_norm"`` where it adds no
        step, or for a smaller side up to :data:`GRAM_NORM_MAX_N` (:data:`SIGMA_BOUNDS`).

    Returns
    -------
    array, shape (..., m, n)
        The polar factor, in ``g``'s namespace, device and dtype.

    Raises
    ------
    ValueError
        Bad option values, NaN/Inf input with ``check_finite=True``.
    TypeError
        Not an array, or not real floating.

    Warns
    -----
    ConvergenceWarning
        Eagerly, when some matrix is not converged (always for ``"quintic"``,
        whose singular values end in about [0.7, 1.2]).

    Examples
    --------
    >>> import numpy as np, matroot
    >>> g = np.random.default_rng(0).standard_normal((4, 8, 3))
    >>> q = matroot.polar(g)
    >>> bool(np.allclose(np.swapaxes(q, -1, -2) @ q, np.eye(3), atol=1e-8))
    True
    """
    result = polar_info(g, **options)
    if not _xp.is_traced(result.converged):
        xp = _xp.array_namespace(result.converged)
        if not bool(xp.all(result.converged)):
            warnings.warn(f"polar: some matrices did not converge with method "
                          f"{result.method!r} (check polar_info(...).converged; for a "
                          "rank-deficient or very ill-conditioned matrix pass a smaller "
                          "lower=, or use method='svd')", ConvergenceWarning, stacklevel=2)
    return result.root
