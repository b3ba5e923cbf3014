"""``refresh_eigenbasis``: the eigenbasis of a stack of symmetric matrices, warm-started
from the previous one, certified per matrix, with eigh for the matrices that need it.

The call: validate → set aside non-finite matrices → symmetrise and scale by a power of
two → orthogonal iteration (:mod:`.orthogonal_iteration`) → eigh for the matrices that
did not converge (only those) → unscale, back to the input's shape and dtype.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from .. import _xp
from .._checks import check_choice, check_stack, refuse_traced
from .._typing import Array
from .certificate import rounding_allowance
from .block_rotation import block_rotation, default_block
from .orthogonal_iteration import orthogonal_iteration

__all__ = ["EigenbasisResult", "refresh_eigenbasis", "DEFAULT_ITERATIONS", "DEFAULT_RTOL",
           "FALLBACKS", "METHODS", "MAX_ITERATIONS"]

#: Steps of orthogonal iteration at most (a matrix stops at its first converged step).
DEFAULT_ITERATIONS = 2
#: The relative residual ‖A·Q − Q·diag(λ)‖_F / ‖A‖_F that counts as converged.
DEFAULT_RTOL = 1e-2
#: What a matrix that did not converge gets: eigh's eigenpairs, or the iterate as it is.
FALLBACKS = ("eigh", "none")
#: The methods: block steps (thin products, :mod:`.block_rotation`) or orthogonal
#: iteration (a full QR per step, :mod:`.orthogonal_iteration`).
METHODS = ("block", "orthogonal")
#: A matrix whose largest entry magnitude lies in this range is used unscaled.
MODERATE = (2.0 ** -40, 2.0 ** 40)
#: Past this many steps an eigh is cheaper on every backend measured (bench/eigenbasis_refresh.py).
MAX_ITERATIONS = 64


class EigenbasisResult(NamedTuple):
    """What :func:`refresh_eigenbasis` returns; arrays in the input's namespace and device.

    Attributes
    ----------
    eigenvectors : array (..., n, n)
        Orthonormal columns, in ascending order of eigenvalue (as eigh returns them).
    eigenvalues : array (..., n)
        Ascending; the Rayleigh quotients ``qᵢᵀ·A·qᵢ`` of the columns.
    residual : array (...)
        ``‖A·Q − Q·diag(λ)‖_F / ‖A‖_F`` of the returned pair (0 for a zero matrix;
        NaN for a matrix with NaN or Inf entries), plus for the block method the
        probed bound on ``‖QᵀQ − I‖_F``: a bound on the relative reconstruction
        error up to the rounding allowance.
    converged : array (...) of bool
        ``residual + rounding allowance ≤ rtol``: the promise above holds.
    iterations : array (...) of int32
        Orthogonal-iteration steps each matrix took (before any fallback).
    fell_back : array (...) of bool
        Which matrices were solved by eigh instead (``fallback="eigh"``).
    """

    eigenvectors: Array
    eigenvalues: Array
    residual: Array
    converged: Array
    iterations: Array
    fell_back: Array

    @property
    def fallbacks(self) -> int:
        """How many matrices eigh solved (read on the host: not under a trace)."""
        xp = _xp.array_namespace(self.fell_back)
        return int(xp.sum(xp.astype(self.fell_back, xp.int32)))


def _check_count(value, name: str, upper: int, why: str) -> int:
    value = refuse_traced(value, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    count = int(value)
    if not 1 <= count <= upper:
        raise ValueError(f"{name}={count} must be from 1 to {upper} ({why})")
    return count


def _check_rtol(value) -> float:
    value = refuse_traced(value, "rtol")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"rtol must be a real number, got {type(value).__name__}")
    number = float(value)
    if not 0 < number < 1:  # comparisons: NaN fails them
        raise ValueError(f"rtol={value} must be in (0, 1): a relative residual of 1 or more "
                         "says nothing about the basis")
    return number


def _check_basis(xp, a, basis):
    check_stack(basis, "basis")
    try:
        _xp.array_namespace(a, basis)
    except TypeError as err:
        raise TypeError(f"basis must be an array of a's library "
                        f"({_xp.backend_name(xp)}), got {type(basis).__name__}") from err
    if tuple(basis.shape) != tuple(a.shape):
        raise ValueError(f"basis must have a's shape {tuple(a.shape)} (one n×n basis per "
                         f"matrix), got {tuple(basis.shape)}")
    if _xp.device_of(basis) != _xp.device_of(a):
        raise ValueError(f"basis is on {_xp.device_of(basis)}, a on {_xp.device_of(a)}; "
                         "move them to one device")


def refresh_eigenbasis(a: Array, basis: Array, /, *, iterations: int = DEFAULT_ITERATIONS,
                       rtol: float = DEFAULT_RTOL, fallback: str = "eigh",
                       method: str = "block", block: int | None = None) -> EigenbasisResult:
    """Eigenvectors and eigenvalues of symmetric (PSD) matrices from a previous basis.

    Refreshes every matrix of the stack at once from its previous basis (block steps
    by default: the dominant columns by subspace iteration and Rayleigh–Ritz, the
    others rotated to stay orthogonal to them, thin products only) and certifies each
    result by its relative residual ``‖A·Q − Q·diag(λ)‖_F / ‖A‖_F``. ``converged``
    promises (docs/eigenbasis.rst): ``‖A − Q·diag(λ)·Qᵀ‖_F ≤ rtol·‖A‖_F``, the sorted
    eigenvalues within ``rtol·‖A‖_F`` of A's (the 2-norm of their differences),
    ``‖QᵀQ − I‖_F ≤ rtol``, and every group of eigenvectors whose eigenvalues lie a
    gap ``δ`` away from the rest of A's spectrum within about ``rtol·‖A‖_F/δ`` of
    A's invariant subspace (sine of the largest angle). For ``method="block"`` the
    orthogonality is bounded by random probes, wrong with probability ≤ 1e-12 per
    matrix.

    Parameters
    ----------
    a : array (..., n, n)
        Symmetric matrices (PSD for the warm start to pay: Shampoo/SOAP factors);
        the symmetric part is used.
    basis : array (..., n, n)
        The previous eigenvectors (columns), e.g. the last call's ``eigenvectors``;
        orthonormal or not (the first step orthonormalises), in any column order.
    iterations : int, default 2
        Orthogonal-iteration steps at most; each matrix stops once converged.
    rtol : float, default 1e-2
        The relative residual to reach, in (0, 1).
    fallback : {"eigh", "none"}
        ``"eigh"``: the matrices that did not converge (only those) are solved by
        ``eigh`` (a matrix with NaN or Inf entries is not: its results are NaN);
        ``"none"``: they keep their last iterate, ``converged=False``.
    method : {"block", "orthogonal"}
        ``"block"``: about ``1 + 6·block/n`` products of n×n matrices per step;
        ``"orthogonal"``: orthogonal (subspace) iteration on all n columns, a
        product and an n×n QR per step, for factors whose mass lies beyond any
        small block.
    block : int, optional
        Columns the block method refreshes by subspace iteration (1…n), default
        ``ceil(n/8)``.

    Returns
    -------
    EigenbasisResult
        ``eigenvectors``, ``eigenvalues``, ``residual``, ``converged``, ``iterations``,
        ``fell_back`` (and ``fallbacks``, their count), in a's namespace, device and
        dtype (16-bit inputs are computed in float32).

    Raises
    ------
    TypeError
        For a or basis not a real floating array of a supported library, arrays of
        two libraries, or options of the wrong type (or traced).
    ValueError
        For shapes that differ or are not square, devices that differ, iterations
        outside 1…64, block outside 1…n, rtol outside (0, 1), an unknown fallback
        or method.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> rng = np.random.default_rng(0)
    >>> g = rng.standard_normal((2, 6, 3))
    >>> factor = g @ np.swapaxes(g, -1, -2)
    >>> basis = np.linalg.eigh(factor)[1]
    >>> g = rng.standard_normal((2, 6, 3))
    >>> new = 0.95 * factor + 0.05 * g @ np.swapaxes(g, -1, -2)
    >>> result = matroot.refresh_eigenbasis(new, basis, rtol=1e-6)
    >>> bool(np.allclose(result.eigenvalues, np.linalg.eigvalsh(new), atol=1e-5))
    True
    >>> result.converged.tolist()
    [True, True]
    """
    xp = check_stack(a, "a")
    _check_basis(xp, a, basis)
    iterations = _check_count(iterations, "iterations", MAX_ITERATIONS,
                              "a basis that needs more steps is cheaper from eigh")
    rtol = _check_rtol(rtol)
    check_choice(fallback, "fallback", FALLBACKS)
    check_choice(method, "method", METHODS)
    batch, n = tuple(a.shape[:-2]), a.shape[-1]
    block = default_block(n) if block is None else _check_count(block, "block", max(n, 1),
                                                              "columns of the n×n basis")
    b = math.prod(batch)
    work = _xp.dtype_from_name(xp, _xp.work_dtype_name(xp, a.dtype))
    if b == 0 or n == 0:
        return _empty(xp, a, batch, n)
    stack = xp.reshape(xp.astype(a, work, copy=False), (b, n, n))
    start = xp.reshape(xp.astype(basis, work, copy=False), (b, n, n))
    traced = _xp.is_traced(stack) or _xp.is_traced(start)
    if _xp.is_jax_namespace(xp):
        _xp.register_jax_pytree(EigenbasisResult)
    static: dict[str, Any] = dict(iterations=iterations, rtol=rtol, method=method,
                                  block=block)
    with _xp.solve_context(xp, stack):
        # One program on JAX, traced too: an eager vmap compiled at every call.
        parts = _xp.one_program(_iterate, stack, dict(start=start), **static)
        if fallback == "eigh":
            parts = _with_fallback(parts, rtol=rtol, traced=traced)
        else:
            parts = parts[:5] + (xp.zeros_like(parts[3]),)
    q, w, residual, converged, steps, fell_back = parts
    dtype = a.dtype
    return EigenbasisResult(
        xp.reshape(xp.astype(q, dtype, copy=False), (*batch, n, n)),
        xp.reshape(xp.astype(w, dtype, copy=False), (*batch, n)),
        xp.reshape(xp.astype(residual, dtype, copy=False), batch),
        xp.reshape(converged, batch), xp.reshape(steps, batch), xp.reshape(fell_back, batch))


def _iterate(stack, *, start, iterations: int, rtol: float, method: str, block: int):
    """The iteration on a ``(b, n, n)`` stack: ``(q, eigenvalues, residual, converged,
    steps, finite, scaled stack)``; NaN results for non-finite matrices."""
    xp = _xp.array_namespace(stack)
    n = stack.shape[-1]
    traced = _xp.is_traced(stack)
    # max|a_ij| per matrix gives the scale and, being NaN or Inf exactly when an entry
    # is, which matrices are finite (inductor may drop NaN from a traced max: there
    # the entries are checked one by one).
    peak = xp.maximum(xp.max(stack, axis=(-2, -1)), -xp.min(stack, axis=(-2, -1)))
    finite = (_xp.finite_matrices(stack) if traced and _xp.is_torch_namespace(xp)
              else xp.isfinite(peak))
    # A sum is NaN or Inf where an entry is (or where it overflows: then the start,
    # not the promise, is lost).
    usable = finite & xp.isfinite(xp.sum(start, axis=(-2, -1)))
    # A matrix whose entries lie in MODERATE is used as it is (no product, square or
    # sum of n terms of them leaves the normal range), others are scaled by a power
    # of two. Eagerly one host read spares the selects of the (usual) all-finite call
    # and, where every matrix is moderate, the pass that would divide them by 1.
    moderate = (peak >= MODERATE[0]) & (peak <= MODERATE[1])
    clean, all_moderate = False, False
    if not traced:
        clean, all_moderate = (bool(flag) for flag in _xp.to_numpy(
            xp.stack([xp.all(usable), xp.all(moderate)])))
    if not clean:
        peak = xp.where(finite, peak, xp.zeros_like(peak))
        stack = _xp.batched_where(finite, stack, xp.zeros_like(stack))
        eye = _xp.identity_stack(xp, n, stack.dtype, _xp.device_of(stack))
        start = _xp.batched_where(usable, start, xp.zeros_like(start) + eye)
    # (A + Aᵀ)/2 scaled by a power of two in two passes: A/2^e + (A/2^e)ᵀ = sym(A)/2^(e−1)
    # with 2^e just above max|a_ij| (exact divisions; at the top of the range 2^e = 2^(e−1)
    # and the entries stay below 4).
    if all_moderate:
        scaled = stack + xp.matrix_transpose(stack)     # 2·sym(A), exactly
        scale = xp.full_like(peak, 0.5)
    else:
        below = _xp.power_of_two_scale(peak[:, None, None])
        double = xp.where(below < float(xp.finfo(stack.dtype).max) / 2, 2 * below, below)
        double = xp.where(moderate, xp.ones_like(double), double)
        scaled = stack / double[:, None, None]
        scaled = scaled + xp.matrix_transpose(scaled)
        scale = double / 2
    if method == "block":
        q, d, residual, converged, steps = block_rotation(
            scaled, start, iterations=iterations, rtol=rtol, block=block, traced=traced)
    else:
        q, d, residual, converged, steps = orthogonal_iteration(
            scaled, start, iterations=iterations, rtol=rtol, traced=traced)
    w = d * scale[:, None]
    if not clean:
        nan = xp.asarray(math.nan, dtype=stack.dtype, device=_xp.device_of(stack))
        q = _xp.batched_where(finite, q, xp.zeros_like(q) + nan)
        w = xp.where(finite[:, None], w, nan)
        residual = xp.where(finite, residual, nan)
    return q, w, residual, converged & finite, steps, finite, scaled, scale


def _eigh_pairs(scaled, scale, rtol: float):
    """eigh of a scaled stack: eigenvectors, eigenvalues (unscaled), residual, converged."""
    xp = _xp.array_namespace(scaled)
    w, v = _xp.lapack_in_order(xp.linalg.eigh, scaled)
    norm = _xp.frobenius_norm(scaled)
    norm = xp.where(norm > 0, norm, xp.ones_like(norm))
    residual = _xp.frobenius_norm(_xp.batched_matmul(scaled, v) - v * w[:, None, :]) / norm
    allowance = rounding_allowance(scaled.shape[-1], float(xp.finfo(scaled.dtype).eps) / 2)
    return v, w * scale[:, None], residual, residual + allowance <= rtol


def _with_fallback(parts, *, rtol: float, traced: bool):
    """eigh for the finite matrices that did not converge (only those): a subset eagerly,
    ``lax.cond`` + ``where`` under jax.jit, outside the graph under torch.compile."""
    q, w, residual, converged, steps, finite, scaled, scale = parts
    xp = _xp.array_namespace(q)
    need = finite & ~converged
    if traced and _xp.is_jax_namespace(xp):
        def solve(operands):
            q, w, residual, converged = operands
            v, lam, res, ok = _eigh_pairs(scaled, scale, rtol)
            return (_xp.batched_where(need, v, q), xp.where(need[:, None], lam, w),
                    xp.where(need, res, residual), xp.where(need, ok, converged))

        q, w, residual, converged = _xp.cond(xp.any(need), solve, lambda ops: ops,
                                             (q, w, residual, converged))
        return q, w, residual, converged, steps, need
    fixed = _xp.outside_torch_compile(_fallback_subset, q, w, residual, converged, need,
                                      scaled, scale, rtol)
    return (*fixed, steps, need)


def _fallback_subset(q, w, residual, converged, need, scaled, scale, rtol: float):
    """Eagerly: eigh of the matrices ``need`` marks (one host read finds them), placed
    by ``take`` and ``where`` (no host copy of the stacks)."""
    xp = _xp.array_namespace(q)
    device = _xp.device_of(q)
    rows = _xp.to_numpy(need).nonzero()[0]
    if rows.size == 0:
        return q, w, residual, converged
    # One matrix per call: torch's batched eigh rounds a matrix differently in batches
    # of different sizes, and a neighbour's failure must not change a matrix's result.
    pairs = [_eigh_pairs(scaled[i:i + 1, ...], scale[i:i + 1], rtol) for i in rows.tolist()]
    v, lam, res, ok = (xp.concat([pair[k] for pair in pairs], axis=0) for k in range(4))
    # Matrix i takes row (number of needs before it) of the subset; the others row 0.
    place = np.maximum(np.cumsum(_xp.to_numpy(need)) - 1, 0)
    place = _xp.from_numpy(xp, place, device=device)
    return (_xp.batched_where(need, xp.take(v, place, axis=0), q),
            xp.where(need[:, None], xp.take(lam, place, axis=0), w),
            xp.where(need, xp.take(res, place, axis=0), residual),
            xp.where(need, xp.take(ok, place, axis=0), converged))


def _empty(xp, a, batch, n) -> EigenbasisResult:
    device = _xp.device_of(a)
    zeros = xp.zeros(batch, dtype=a.dtype, device=device)
    return EigenbasisResult(
        xp.zeros((*batch, n, n), dtype=a.dtype, device=device),
        xp.zeros((*batch, n), dtype=a.dtype, device=device), zeros,
        xp.ones(batch, dtype=xp.bool, device=device),
        xp.zeros(batch, dtype=xp.int32, device=device),
        xp.zeros(batch, dtype=xp.bool, device=device))
