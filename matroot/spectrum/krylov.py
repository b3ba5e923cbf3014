"""Krylov building blocks: fixed-seed start vectors, power iteration, Lanczos.

Everything here touches a matrix only through products with a few vectors
(O(n²) per step, no matrix-matrix products): the batched power iteration behind
:func:`power_iteration`, and one batched Lanczos run with full
reorthogonalisation whose extreme Ritz values (:func:`ritz_values`) feed the
λmax bound (:mod:`matroot.spectrum.lambda_max_bounds`), the λmin estimate
(:func:`matroot.spectrum.scaling.lambda_min_estimate`) and the check's κ
(:mod:`matroot.certify.verify`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import _xp
from .._checks import check_stack
from .._typing import Array

__all__ = ["power_iteration", "lanczos_ritz_extremes", "RitzValues", "ritz_values",
           "LANCZOS_STEPS"]

_START_SEED = 20240607

#: Lanczos steps of :func:`lambda_min_estimate` (matrix-vector products).
LANCZOS_STEPS = 64

@_xp.host_constant
def _start_matrix(n: int, k: int) -> np.ndarray:
    # A fixed-seed host draw: reproducible, never touches the global RNG, and the
    # same start on every backend so results agree across them.
    rng = np.random.default_rng(_START_SEED + 7919 * n + k)
    v = rng.standard_normal((n, k))
    v /= np.linalg.norm(v, axis=0, keepdims=True)
    v.flags.writeable = False
    return v


#: Start vectors kept on their devices, keyed by (backend, device, dtype, n, k)
#: as strings (not every backend's device object is hashable); oldest dropped first.
_START_VECTORS: dict = {}
_START_VECTORS_KEPT = 64


def _start_vectors(xp, n: int, k: int, dtype, device):
    # Kept, so the copy to the device happens once per size; callers only read it.
    return _xp.kept(_START_VECTORS, (_xp.backend_name(xp), str(device), str(dtype), n, k),
                    _START_VECTORS_KEPT,
                    lambda: _xp.from_numpy(xp, _start_matrix(n, k), dtype=dtype, device=device))


def _entry_scale(xp, a):
    """Per-matrix max |entry|, with 1 for all-zero matrices (so a / scale is safe)."""
    # Two reductions, no |a| temporary (which costs more than both on torch CPU).
    m = xp.maximum(xp.max(a, axis=(-2, -1)), -xp.min(a, axis=(-2, -1)))
    return xp.where(m > 0, m, xp.ones_like(m))


_POWER_VECTORS = 4
_POWER_STEPS = 12
#: Matrix-vector products of one default :func:`power_iteration` (a matmul is n of them).
POWER_MATVECS = _POWER_VECTORS * _POWER_STEPS


def power_iteration(a: Array, /, *, num_vectors: int = _POWER_VECTORS,
                    num_iter: int = _POWER_STEPS) -> Array:
    """Batched multi-vector power iteration estimate of λmax for symmetric PSD stacks.

    Every matrix of the stack is iterated at once with ``num_vectors`` start
    vectors; the estimate is the largest ``‖A v‖ / ‖v‖`` seen, which for a PSD
    matrix is a lower bound on λmax that tightens with ``num_iter``.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive semidefinite matrices.
    num_vectors : int, optional
        Start vectors per matrix. More vectors help when the top eigenvalues cluster.
    num_iter : int, optional
        Multiplications by ``a``.

    Returns
    -------
    array, shape (...)
        λmax estimates (``<=`` the true λmax up to rounding); 0 for all-zero matrices.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.diag([1.0, 2.0, 5.0])
    >>> float(matroot.power_iteration(a))  # doctest: +ELLIPSIS
    4.99...
    """
    check_stack(a)
    return power_iteration_core(a, num_vectors=num_vectors, num_iter=num_iter)


def power_iteration_core(a: Array, *, num_vectors: int = _POWER_VECTORS,
                         num_iter: int = _POWER_STEPS) -> Array:
    """:func:`power_iteration` without input validation, for callers that checked ``a``."""
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    batch = a.shape[:-2]
    if n == 0 or 0 in batch:
        return xp.zeros(batch, dtype=a.dtype, device=_xp.device_of(a))
    scale = _entry_scale(xp, a)
    return _power_scaled(a / scale[..., None, None], num_vectors, num_iter) * scale


def _power_scaled(b, num_vectors: int = _POWER_VECTORS, num_iter: int = _POWER_STEPS):
    """:func:`power_iteration_core` of a stack whose entries are at most 1 in size."""
    xp = _xp.array_namespace(b)
    n = b.shape[-1]
    batch = b.shape[:-2]
    k = max(1, min(num_vectors, n))
    # Row vectors: for symmetric b, vᵀb = (bv)ᵀ, and a few rows times a matrix stream
    # it row by row (4 vectors, n = 256: 3-9× faster than b @ v on torch and NumPy CPU).
    v = xp.matrix_transpose(_start_vectors(xp, n, k, b.dtype, _xp.device_of(b)))
    v = xp.broadcast_to(v, (*batch, k, n))
    tiny = xp.finfo(b.dtype).smallest_normal
    norms = []
    for _ in range(num_iter):
        w = _xp.batched_matmul(v, b)
        norms.append(xp.linalg.vector_norm(w, axis=-1, keepdims=True))
        v = w / xp.clip(norms[-1], min=tiny)
    # The largest ‖b·v‖ over every vector and step, read once at the end.
    return xp.max(xp.concat(norms, axis=-1), axis=(-2, -1))


def _lanczos_coefficients(a, num_steps: int):
    """Batched Lanczos with full reorthogonalisation, on the device.

    Returns ``(coefficients, steps)``: a ``(b, 2m + 1)`` array holding the
    ``m = steps`` diagonal entries α of the tridiagonal matrix of ``a / scale``,
    its ``m`` couplings β (the last one couples to the next Lanczos vector: 0
    once the Krylov space is exhausted) and the per-matrix entry scale.
    """
    steps = max(1, min(int(num_steps), a.shape[-1]))
    # Eager JAX compiles every operation for its shapes, and the growing basis has new
    # ones at each step: about 400 compiles (20-40 s) per new n. One program per shape.
    return _xp.one_program(_lanczos_run, a, steps=steps), steps


def _lanczos_run(a, steps: int):
    """:func:`_lanczos_coefficients`' array, for ``steps`` steps."""
    xp = _xp.array_namespace(a)
    batch = tuple(a.shape[:-2])
    n = a.shape[-1]
    b = math.prod(batch)
    dev = _xp.device_of(a)
    scale = xp.reshape(_entry_scale(xp, a), (b,))
    mat = xp.reshape(a, (b, n, n)) / scale[:, None, None]
    # Row vectors (vᵀA = (Av)ᵀ for symmetric A): a row times the stack streams it
    # row by row, ~9× faster than A @ v for one vector at n = 384 on torch CPU.
    fresh = xp.matrix_transpose(_start_vectors(xp, n, steps + 1, a.dtype, dev))
    limit = n * float(xp.finfo(a.dtype).eps)
    run = _lanczos_rolled if _xp.is_traced(mat) else _lanczos_growing
    alphas, betas, peaks = run(xp, mat, fresh, steps, limit)
    # Where the Krylov space was exhausted the step went on from the restart row
    # (see _lanczos_step): the tridiagonal decouples there.
    betas = xp.where(betas <= limit * peaks, xp.zeros_like(betas), betas)
    return xp.concat([alphas, betas, scale[:, None]], axis=-1)


def _lanczos_step(xp, mat, v, pair, peak, basis, restart, limit: float):
    """One Lanczos step from the row ``v = v_j``: ``(local, β, peak, next v)``, each
    ``(b, 1, ·)``.

    ``pair`` holds ``(v_(j−1), v_j)`` as rows (a zero row before the first),
    ``peak`` the largest ``‖v·A‖`` so far (a lower bound on ‖A‖₂; None at the
    start), ``basis`` every Lanczos vector so far (rows of zeros count as none),
    ``restart`` a fresh row. ``local`` is ``(β_j, α_j)``, the
    coefficients of ``w = v_j·A`` on the pair.

    The three-term recurrence takes the large, local part off ``w``; what is left
    along the other basis vectors is rounding, of order ``u·‖A‖``, and one
    Gram–Schmidt pass against the basis takes it off (the restart row rides along
    in the same pair of products). Where β, read after that pass, is at that
    rounding level, ``β ≤ n·ε·peak`` (``limit = n·ε``), the Krylov space is
    exhausted: the run goes on from the restart row and the tridiagonal decouples
    (β is zeroed by the caller). The threshold is relative to ‖A‖, not to
    ``‖v·A‖``: the rounding of ``v·A`` is ``u·|v|·|A|``, so for a v in a small
    eigenspace the noise is far above ``u·‖v·A‖``, and a noise row kept as a
    direction would leave each next pass a worse start, losing orthogonality
    geometrically. A breakdown threshold ≥ the noise keeps every kept β well
    above what the one pass leaves behind, so the basis stays orthonormal to
    rounding and every Ritz value inside the spectrum.
    """
    tiny = xp.finfo(mat.dtype).smallest_normal
    w = _xp.batched_matmul(v, mat)
    reach = xp.linalg.vector_norm(w, axis=-1, keepdims=True)
    peak = reach if peak is None else xp.maximum(peak, reach)
    local = _xp.batched_matmul(w, xp.matrix_transpose(pair))
    rows = xp.concat([_xp.add_product(w, local, pair, alpha=-1.0), restart], axis=-2)
    coefficients = _xp.batched_matmul(rows, xp.matrix_transpose(basis))
    rows = _xp.add_product(rows, coefficients, basis, alpha=-1.0)
    norms = xp.linalg.vector_norm(rows, axis=-1, keepdims=True)
    rows = rows / xp.clip(norms, min=tiny)
    beta = norms[:, :1, :]
    following = xp.where(beta <= limit * peak, rows[:, 1:, :], rows[:, :1, :])
    return local, beta, peak, following


def _lanczos_growing(xp, mat, fresh, steps: int, limit: float):
    """The eager loop of :func:`_lanczos_coefficients`, its basis growing a row per
    step. Returns ``(alphas, betas, peaks)``, each ``(b, steps)``."""
    b, n = mat.shape[0], mat.shape[-1]
    # One unstack into (b, 1, n) rows, not a slice per step.
    restarts = xp.unstack(xp.broadcast_to(xp.reshape(fresh, (steps + 1, 1, 1, n)),
                                          (steps + 1, b, 1, n)))
    basis = v = restarts[0]
    pair = xp.concat([xp.zeros_like(v), v], axis=-2)
    peak = None
    locals_, betas, peaks = [], [], []
    for j in range(steps):
        local, beta, peak, v = _lanczos_step(xp, mat, v, pair, peak, basis,
                                             restarts[j + 1], limit)
        locals_.append(local)
        betas.append(beta)
        peaks.append(peak)
        if j < steps - 1:
            basis = xp.concat([basis, v], axis=-2)
            pair = basis[:, -2:, :]
    alphas = xp.concat(locals_, axis=-2)[:, :, 1]
    return alphas, *(xp.reshape(xp.concat(values, axis=-1), (b, steps))
                     for values in (betas, peaks))


def _lanczos_rolled(xp, mat, fresh, steps: int, limit: float):
    """The loop of :func:`_lanczos_coefficients` with shapes fixed from step to step,
    for tracing: under ``jax.jit`` one device loop (XLA compiled the unrolled
    growing-basis steps for seconds per call site). The basis is a fixed
    ``(b, steps, n)`` array whose rows not yet filled are zero: orthogonalising
    against it is the same arithmetic as against the filled rows alone. Returns
    ``(alphas, betas, peaks)``, each ``(b, steps)``.
    """
    b, n = mat.shape[0], mat.shape[-1]
    dev = _xp.device_of(mat)
    rows = xp.arange(steps, device=dev)[None, :]
    fresh = xp.broadcast_to(fresh, (b, steps + 1, n))
    v = fresh[:, :1, :]
    basis = xp.where((rows == 0)[..., None], v,
                     xp.zeros((b, steps, n), dtype=mat.dtype, device=dev))
    zeros = xp.zeros((b, steps), dtype=mat.dtype, device=dev)

    def step(carry, j):
        basis, pair, peak, alphas, betas, peaks = carry
        index = xp.reshape(xp.asarray(j, device=dev), (1,))
        local, beta, peak, following = _lanczos_step(
            xp, mat, pair[:, 1:, :], pair, peak, basis, xp.take(fresh, index + 1, axis=1), limit)
        at = rows == j
        alphas, betas, peaks = (xp.where(at, new[:, 0, -1:], old) for new, old in
                                ((local, alphas), (beta, betas), (peak, peaks)))
        basis = xp.where((rows == j + 1)[..., None], following, basis)
        return basis, xp.concat([pair[:, 1:, :], following], axis=-2), peak, alphas, betas, peaks

    no_peak = xp.zeros((b, 1, 1), dtype=mat.dtype, device=dev)
    carry = (basis, xp.concat([xp.zeros_like(v), v], axis=-2), no_peak, zeros, zeros, zeros)
    _, _, _, alphas, betas, peaks = _xp.counted_loop(step, carry, steps, roll_like=mat)
    return alphas, betas, peaks


class RitzValues(NamedTuple):
    """Per matrix, the extreme Ritz values of one Lanczos run (see :func:`ritz_values`).

    Host float64 NumPy arrays after one transfer, or under jax.jit /
    torch.compile (nothing can be read back) device arrays in the input's dtype;
    shape ``a.shape[:-2]``, in the units of ``a``.
    """

    low: Array
    """θmin ≥ λmin (up to rounding)."""
    high: Array
    """θmax ≤ λmax (up to rounding)."""
    spread: Array
    """``β_m·|s_m|``: some eigenvalue lies within it of θmin."""
    steps: int = 0
    """Dimension of the Krylov space the run built (0: not known); ``n`` means
    the whole space, where the Ritz values are the eigenvalues."""

    def divided(self, scale: Array) -> RitzValues:
        """The Ritz values of ``a / scale`` (``scale`` per matrix, a device array)."""
        if isinstance(self.low, np.ndarray):
            scale = _xp.to_numpy(scale).astype(np.float64)
        return RitzValues(self.low / scale, self.high / scale, self.spread / scale, self.steps)


def ritz_values(a: Array, *, num_steps: int = LANCZOS_STEPS) -> RitzValues:
    """One batched Lanczos run's extreme Ritz values, for every matrix of a stack.

    Both consumers read the same run (no input validation): the λmin estimate
    of the minimax schedule (:func:`lambda_min_estimate`) and the κ estimate
    of the a-posteriori check (:func:`matroot.certify.verify.verify_root`), so a call
    that needs both pays for one.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.spectrum.scaling import ritz_values
    >>> r = ritz_values(np.diag([1.0, 2.0, 5.0]))
    >>> round(float(r.low), 6), round(float(r.high), 6), float(r.spread)
    (1.0, 5.0, 0.0)
    """
    batch = tuple(a.shape[:-2])
    if a.shape[-1] == 0 or 0 in batch:
        return RitzValues(np.zeros(batch), np.zeros(batch), np.zeros(batch), a.shape[-1])
    xp = _xp.array_namespace(a)
    coefficients, m = _lanczos_coefficients(a, num_steps)
    traced = _xp.is_traced(a)
    if traced:
        ns, dev = xp, _xp.device_of(a)

        def band(k):
            return _xp.from_numpy(xp, np.eye(m, k=k), dtype=a.dtype, device=dev)
    else:
        ns, coefficients = np, _xp.to_numpy(coefficients).astype(np.float64)

        def band(k):
            return np.eye(m, k=k)
    upper = coefficients[:, m:2 * m, None] * band(1)  # β_i at (i, i+1); β_m falls off
    tri = coefficients[:, :m, None] * band(0) + upper + ns.matrix_transpose(upper)
    if traced:
        ritz, vectors = _xp.lapack_in_order(ns.linalg.eigh, tri)
    else:
        ritz, vectors = _host_eigh(tri)
    last_beta = coefficients[:, 2 * m - 1] if m < a.shape[-1] else ns.zeros_like(ritz[:, 0])
    scale = coefficients[:, -1]
    spread = last_beta * ns.abs(vectors[:, -1, 0])
    low, high, spread = (ns.reshape(v * scale, batch) for v in (ritz[:, 0], ritz[:, -1], spread))
    return RitzValues(low, high, spread, m)


_BLAS_POOLS: list = []


def _host_eigh(tri: np.ndarray):
    """NumPy's eigh of the small tridiagonal stack, its BLAS on one thread.

    At m ≥ 32 OpenBLAS hands these 8-matrix eighs to its thread pool, whose
    threads then wait for cores that torch's OpenMP workers are still spinning
    on: 50–150 ms instead of 0.6–2 ms (2-core CPU, 8×384² float32 torch stack).
    """
    if not _BLAS_POOLS:
        from threadpoolctl import ThreadpoolController

        _BLAS_POOLS.append(ThreadpoolController())
    with _BLAS_POOLS[0].limit(limits=1, user_api="blas"):
        return np.linalg.eigh(tri)


def lanczos_ritz_extremes(a: Array, /, *,
                          num_steps: int = LANCZOS_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest Ritz values of a batched Lanczos run, for every matrix.

    ``num_steps`` products ``A v`` per matrix (matrix-vector, not matrix-matrix,
    so about ``num_steps/n`` of one n×n matmul) with full reorthogonalisation,
    from a fixed-seed start vector; a breakdown (an invariant subspace found)
    restarts from a fresh vector orthogonal to the basis, which keeps every Ritz
    value inside ``[λmin, λmax]``. The small tridiagonal eigenproblems are solved
    on the host: one transfer per call.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric matrices.
    num_steps : int
        Lanczos steps (capped at n).

    Returns
    -------
    (ndarray, ndarray)
        Host float64 arrays of shape ``a.shape[:-2]``: ``θmin ≥ λmin`` and
        ``θmax ≤ λmax`` (up to rounding). Under jax.jit / torch.compile, where
        nothing can be read back, device arrays in ``a``'s dtype instead.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.spectrum.scaling import lanczos_ritz_extremes
    >>> lo, hi = lanczos_ritz_extremes(np.diag([1.0, 2.0, 5.0]))
    >>> round(float(lo), 6), round(float(hi), 6)
    (1.0, 5.0)
    """
    check_stack(a)
    return lanczos_ritz_extremes_core(a, num_steps=num_steps)


def lanczos_ritz_extremes_core(a: Array, *, num_steps: int = LANCZOS_STEPS
                               ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`lanczos_ritz_extremes` without input validation, for callers that checked ``a``."""
    ritz = ritz_values(a, num_steps=num_steps)
    return ritz.low, ritz.high

