"""A-posteriori verification of returned roots: true residual, sign, error estimate.

A solver's own residual (``‖I − ZY‖`` or ``‖I − M‖``) belongs to its coupled
iterates, which drift apart in float32, and it cannot see a root on the wrong
branch (a negative eigenvalue). So every result is checked once, at the end, from
the root ``X`` it returns and the scaled matrix ``A`` (spectrum in (0, 1]), in the
compute dtype, batched:

- ``R = X^p·A − I`` and ``residual = ‖R‖_F/√n`` (integer p);
- ``error_estimate = ‖sym(R·X)‖_F / (p·‖X‖_F)``, an estimate of the relative
  forward error ``‖X̃ − X‖_F/‖X‖_F``. Derivation: write ``X̃ = X + E``. To first
  order ``R = Σ_k X^k E X^(p−1−k) A`` and, as ``X^p A = I``, ``R·X = Σ_k X^k E X^(−k)``.
  In the eigenbasis of A, with ``r = x_i/x_j``, entry (i, j) is
  ``E_ij·(1 + r + … + r^(p−1))``: exactly ``p·E`` where E commutes with A (so
  for ``X̃ = X(I + F)`` the residual is ``≈ p‖F‖``), and larger where E couples
  eigenvalues far apart (``r`` up to ``κ^(1/p)``); symmetrising averages the
  (i, j) and (j, i) factors. Measured on the accuracy suite (float32, n = 48,
  κ = 1e2…1e6, p = 1, 2, 3, 4, 8, newton_db / coupled_newton / minimax) the
  estimate is 0.8× to 3.1× the float64-oracle error (down to 0.58× near the rounding
  floor, κ ≥ 1e4: :data:`matroot.certify.accuracy.ESTIMATE_UNDERSHOOT`), with 16-bit matmuls 1× to
  11× (the rounding of 16-bit products does not commute with A); the plain
  ``‖R‖_F/(p√n)`` overstates it by up to 40× in float32. Symmetrising is
  what makes it an upper bound to first order: the (i, j) factor becomes
  ``Σ_k (r^k + r^(−k))/2 ≥ p``. It is *only* first order: where the root is far
  off in some direction (a few fixed steps, a huge p) the products shrink that
  direction's error instead of showing it (scalar: ``x̃ = x(1+δ)`` gives
  ``(1+δ)((1+δ)^p − 1)/p``, which tends to 0 as δ → −1);
- so the estimate is used only where the residual's spectral norm ρ (a few power
  steps on ``R``) is below :data:`LINEAR_REGIME` or within the check's own
  rounding; beyond that it is replaced by the per-direction bound
  :func:`sandwich_bound` (``∞`` for ρ ≥ 1), which no direction escapes;
- a sign check for even p, where ``X^p·A = I`` holds on either branch: a
  Cholesky factorisation of ``X`` (whose eigenvalues are ≥ 1 for a right root,
  since λmax(A) ≤ 1, and ≤ −1 on a flipped one) must succeed. For odd p a flipped
  eigenvalue shows in ``R`` itself;
- ``kappa = θmax/θmin``, the ratio of the extreme Ritz values of a Lanczos run on
  A (:func:`matroot.spectrum.scaling.lanczos_ritz_extremes`), which picks the accuracy
  target. Ritz values lie inside the spectrum, so this is a lower bound on κ(A)
  (up to rounding) and picks the target of κ's bucket or a stricter one; it does
  not depend on the root, whose own errors would make a κ from X unreliable.
  Where the call made no Lanczos run (nothing else needed one: the caller's
  bounds, or a method that takes no λmin estimate), κ is
  :func:`kappa_from_root`'s estimate instead: Rayleigh quotients of A and of X,
  so it too stays below κ, up to the factor ``1 + ρ`` of the root's residual
  (a root with ρ ≥ 1 gets an infinite error estimate whatever κ is);

For even p the residual is formed in the balanced form ``X^(p/2)·A·X^(p/2) − I``
(similar to ``X^p·A − I``): its first-order response to E grows like
``r^(p/2)`` instead of ``r^(p−1)``, which keeps the estimate within 0.8–3× of the
oracle error at p = 8 too (``X^p·A − I``: up to 60× for coupled_newton).

Cost: the products of ``X^(p/2)`` (or ``X^p``), then ``·A``, ``·X^(p/2)`` and
``·X`` (``p = 2``: 3, ``p = 4``: 4, ``p = 8``: 5), 1/6 matmul for the Cholesky
(even p), ``LANCZOS_STEPS/n`` for the Lanczos run (one host transfer; 40/n
for :func:`kappa_from_root` where no run was made) and
24/n (48/n for odd p) for the power steps on ``R``. With
``certificate="randomized"`` the products are replaced by (2p + 3) products of an
n×n matrix with an n×24 probe block (:func:`verify_root`, :mod:`matroot.certify.probes`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .. import _xp
from .._xp import matrix_power, power_matmuls
from .._checks import check_choice
from .._typing import Array
import numpy as np

from .probes import FROBENIUS_FACTOR, PROBE_SEED, PROBES, SPECTRAL_FACTOR, probe_block
from ..spectrum.scaling import (LANCZOS_STEPS, RitzValues, _start_vectors, power_iteration_core,
                      ritz_values)
from .accuracy import BUCKET_SLACK, LOW_PRECISION_ROWS

__all__ = ["BUCKET_SLACK", "CERTIFICATES", "DEFAULT_CERTIFICATE", "LOW_PRECISION_ROWS", "RootCheck",
           "kappa_from_root", "sandwich_bound", "verify_root"]

#: How the residual of a root is measured: every product formed ("deterministic"),
#: or only its products with Gaussian probe vectors, bounded with a stated failure
#: probability (:mod:`matroot.certify.probes`; "randomized").
CERTIFICATES = ("randomized", "deterministic")
#: The check of a root when ``certificate`` is not given. Measured in
#: ``tests/certify/test_randomized_check.py``: the randomized estimate is 5–33× the oracle
#: error (deterministic: 1–4×), so it would turn good roots near the target unconverged.
DEFAULT_CERTIFICATE = "deterministic"


class RootCheck(NamedTuple):
    """Per-matrix results of checking roots (:func:`matroot.certify.verify.verify_root`, or a
    solver's own check), each of shape (b,) but ``matmul_equivalents``, their cost;
    ``root_norm``: ``‖X‖_F`` of the checked root where the check formed it, else None."""

    residual: Array
    error_estimate: Array
    positive: Array
    kappa: Array
    matmul_equivalents: float
    root_norm: Array | None = None



def _products(root, scaled, p: int):
    """``R·X`` and ``R`` with ``R = X^p·A − I``; the products formed."""
    xp = _xp.array_namespace(root)
    eye = _xp.identity_stack(xp, root.shape[-1], root.dtype, _xp.device_of(root))
    plain = _xp.Matmul(xp)
    # The products are fresh: I is subtracted from them in place (on torch).
    if p % 2:
        residual = _xp.scaled_plus_identity(matrix_power(root, p, plain) @ scaled, 1.0,
                                            (-1.0,), eye, overwrite=True)
        return residual @ root, residual, power_matmuls(p) + 2
    half = matrix_power(root, p // 2, plain)
    residual = _xp.scaled_plus_identity(half @ scaled @ half, 1.0, (-1.0,), eye,
                                        overwrite=True)
    return residual @ root, residual, power_matmuls(p // 2) + 3


#: Residuals whose spectral norm exceeds this leave the first-order regime: the
#: estimate is then replaced by the per-direction bound (:func:`sandwich_bound`).
LINEAR_REGIME = 0.5
#: The check's own rounding: forming ``X^(p/2)·A·X^(p/2)`` in the compute dtype
#: perturbs it by about ``u·κ`` in spectral norm (measured 0.15–0.35× that in
#: float32 at κ = 1e6, n = 64–256, p = 2–8; up to ``n·u·κ`` for the inverse,
#: p = 1); below this factor times that, a large residual may be the check's
#: noise rather than the root's error, and the first-order estimate, measured
#: within 0.8–3× of the oracle error there, is kept.
CHECK_FLOOR_FACTOR = 4.0
_SPECTRAL_VECTORS = 4
_SPECTRAL_STEPS = 6
_SPECTRAL_MATVECS = _SPECTRAL_VECTORS * _SPECTRAL_STEPS


def sandwich_bound(rho, p):
    """Bound on the relative Frobenius error of an SPD root whose residual has spectral norm ρ.

    If ``X̃`` is symmetric positive definite and ``‖X̃^(p/2)·A·X̃^(p/2) − I‖₂ ≤ ρ < 1``
    (or the same for any matrix similar to it, such as ``X̃^p·A − I``, whose
    spectral norm is at least its spectral radius), then
    ``(1−ρ)·X̃^(−p) ≤ A ≤ (1+ρ)·X̃^(−p)`` in the Loewner order; ``t ↦ t^(1/p)`` is
    operator monotone, so ``(1+ρ)^(−1/p)·X̃ ≤ X ≤ (1−ρ)^(−1/p)·X̃`` for the true root
    ``X = A^(−1/p)``. Hence ``X − X̃ = c·X̃^(1/2)·K·X̃^(1/2)`` with ``‖K‖₂ ≤ 1`` and
    ``c = (1−ρ)^(−1/p) − 1``, so ``‖X − X̃‖_F ≤ c·‖X̃‖_F`` (``tr(KX̃KX̃) ≤ ‖KX̃‖_F²``),
    and ``‖X‖_F ≥ (1+ρ)^(−1/p)·‖X̃‖_F``:

        ``‖X − X̃‖_F/‖X‖_F ≤ (1+ρ)^(1/p)·((1−ρ)^(−1/p) − 1)``  (≈ ρ/p for small ρ).

    It bounds the error in *every* direction, so it never misses a direction in
    which the root is far too small or too large; ``inf`` for ρ ≥ 1.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.certify.verify import sandwich_bound
    >>> np.round(sandwich_bound(np.array([1e-3, 0.5, 1.0]), 4), 6).tolist()
    [0.00025, 0.209392, inf]
    """
    xp = _xp.array_namespace(rho)
    below = rho < 1
    safe = xp.where(below, rho, xp.zeros_like(rho))
    bound = (1 + safe) ** (1 / p) * ((1 - safe) ** (-1 / p) - 1)
    return xp.where(below, bound, xp.full_like(rho, float("inf")))


def residual_spectral_norm(residual, *, symmetric: bool):
    """A few block power steps on a ``(b, n, n)`` residual: an estimate of ``‖R‖₂``
    from below, tight for a dominant direction (O(n²) per step, no products)."""
    xp = _xp.array_namespace(residual)
    n = residual.shape[-1]
    k = min(_SPECTRAL_VECTORS, n)
    v = xp.matrix_transpose(_start_vectors(xp, n, k, residual.dtype,
                                           _xp.device_of(residual)))
    v = xp.broadcast_to(v, (residual.shape[0], k, n))
    tiny = float(xp.finfo(residual.dtype).smallest_normal)
    best = xp.zeros(residual.shape[:1], dtype=residual.dtype, device=_xp.device_of(residual))
    for _ in range(_SPECTRAL_STEPS):
        w = v @ residual if symmetric else (v @ residual) @ xp.matrix_transpose(residual)
        norms = xp.linalg.vector_norm(w, axis=-1)
        gain = norms if symmetric else xp.sqrt(norms)
        best = xp.maximum(best, xp.max(gain, axis=-1))
        v = w / xp.clip(norms, min=tiny)[..., None]
    return best


def beyond_first_order(estimate, spectral, floor, p):
    """The first-order ``estimate`` corrected for the size of the residual.

    Where the residual's spectral norm ρ is at most :data:`LINEAR_REGIME` (or
    within the check's rounding ``floor``) the estimate is scaled by how far the
    exact per-direction bound exceeds its own linearisation,
    ``sandwich_bound(ρ)/(ρ/p)`` (1 for small ρ, 1.6 at ρ = 1/2 and p = 4); beyond,
    it is the larger of the estimate and :func:`sandwich_bound` (``∞`` for ρ ≥ 1).
    """
    xp = _xp.array_namespace(estimate)
    linear = spectral <= xp.maximum(floor, xp.full_like(floor, LINEAR_REGIME))
    bound = sandwich_bound(spectral, p)
    small = (spectral > 0) & (spectral < LINEAR_REGIME)
    growth = xp.where(small, bound / xp.where(small, spectral / p, xp.ones_like(spectral)),
                      xp.ones_like(spectral))
    return xp.where(linear, estimate * growth, xp.maximum(estimate, bound))


def _probed_norms(safe, scaled, p: int, seed: int):
    """From probes alone, with their failure probability: upper bounds on ``‖R‖₂``
    and on ``‖R·X‖_F`` (which bounds ``‖sym(R·X)‖_F``: ``X·R = (R·X)ᵀ`` for the
    balanced form, and averaging two matrices of one norm cannot exceed it), the
    estimate ``rms_i ‖R·ω_i‖ ≈ ‖R‖_F`` and the matrix-vector blocks formed.

    ``R·v`` is ``X^(p/2)·(A·(X^(p/2)·v)) − v`` for even p, ``X^p·(A·v) − v`` for odd
    p (p + 1 products of an n×n matrix with the block); one pass takes ``Ω`` and
    ``X·Ω`` together."""
    xp = _xp.array_namespace(safe)
    n = safe.shape[-1]
    omega = probe_block(xp, n, safe.dtype, _xp.device_of(safe), seed=seed)
    block = xp.concat([xp.broadcast_to(omega, (safe.shape[0], n, PROBES)), safe @ omega],
                      axis=-1)
    v = block
    if p % 2 == 0:
        for _ in range(p // 2):
            v = safe @ v
        v = scaled @ v
        for _ in range(p // 2):
            v = safe @ v
    else:
        v = scaled @ v
        for _ in range(p):
            v = safe @ v
    applied = v - block
    norms = xp.linalg.vector_norm(applied, axis=-2)  # (b, 2·PROBES) column norms
    on_omega, on_x_omega = norms[:, :PROBES], norms[:, PROBES:]
    rms = xp.sqrt(xp.mean(on_omega * on_omega, axis=-1))
    spectral = xp.minimum(SPECTRAL_FACTOR * xp.max(on_omega, axis=-1), FROBENIUS_FACTOR * rms)
    times_x = FROBENIUS_FACTOR * xp.sqrt(xp.mean(on_x_omega * on_x_omega, axis=-1))
    return spectral, times_x, rms, 2 * (p + 1) + 1


_KAPPA_POWER_VECTORS = 4
_KAPPA_POWER_STEPS = 5


def kappa_from_root(scaled, root, p, kappa_bound):
    """A κ estimate for the check without a Lanczos run: the smaller of the caller's
    ``kappa_bound`` (λmax bound ÷ λmin bound, ≥ κ when the bounds are right) and
    ``θ_A · θ_X^p``, with ``θ_A ≤ λmax(A)`` and ``θ_X ≤ λmax(X)`` from a few block
    power steps on the matrix and on its root.

    Both θ are Rayleigh quotients, and where the root's residual has spectral norm
    ρ < 1, ``λmax(X)^p ≤ (1 + ρ)/λmin(A)`` (:func:`sandwich_bound`'s Loewner
    sandwich), so the estimate is at most ``(1 + ρ)·κ``: like the Ritz ratio, a
    lower estimate that picks κ's bucket or a stricter one. Returns
    ``(kappa, matmul_equivalents)``.
    """
    xp = _xp.array_namespace(root)
    n = root.shape[-1]
    theta_a, theta_x = (power_iteration_core(m, num_vectors=_KAPPA_POWER_VECTORS,
                                             num_iter=_KAPPA_POWER_STEPS)
                        for m in (scaled, root))
    kappa = xp.minimum(theta_a * theta_x ** p, kappa_bound)
    return kappa, 2 * min(_KAPPA_POWER_VECTORS, n) * _KAPPA_POWER_STEPS / n


def _check_stacks(scaled, root, certificate: str) -> None:
    """A public caller's arguments: two stacks of one shape (a single matrix would be
    read as a stack of rows) and a known certificate."""
    check_choice(certificate, "certificate", CERTIFICATES)
    if scaled.ndim < 3 or tuple(scaled.shape) != tuple(root.shape) \
            or scaled.shape[-1] != scaled.shape[-2]:
        raise ValueError(f"scaled and root must be stacks (b, n, n) of one shape, got "
                         f"{tuple(scaled.shape)} and {tuple(root.shape)}; add a leading "
                         "axis to a single matrix (a[None])")


def verify_root(scaled, root, p, *, unit_roundoff: float,
                ritz: RitzValues | None = None, kappa_bound=None,
                certificate: str = DEFAULT_CERTIFICATE, probe_seed: int = PROBE_SEED) -> RootCheck:
    """Check roots ``root ≈ scaled^(-1/p)`` of a ``(b, n, n)`` stack from the roots themselves.

    Parameters
    ----------
    scaled : array, shape (b, n, n)
        The regularised, scaled symmetric stack (spectrum in (0, 1]).
    root : array, shape (b, n, n)
        The solver's inverse roots of ``scaled``, same dtype.
    p : int or float
        Root order. For a non-integer p (only ``evd``) no product can form
        ``X^p``: ``residual`` is NaN and ``error_estimate`` is ``u·κ/p``, the
        first-order effect of a relative error ``u·κ`` in the smallest eigenvalue.
    unit_roundoff : float
        ``u`` of the compute dtype.
    ritz : RitzValues, optional
        :func:`matroot.spectrum.scaling.ritz_values` of ``scaled``, when the caller ran
        them already (for the minimax schedule's λmin): κ then costs nothing.
    kappa_bound : array, shape (b,), optional
        With ``ritz`` None: an upper bound on κ from the caller's spectral
        bounds; κ is then :func:`kappa_from_root` (no Lanczos run).
    certificate : {"deterministic", "randomized"}
        ``"deterministic"`` forms ``R`` and ``R·X``; ``"randomized"`` only their
        products with :data:`matroot.certify.probes.PROBES` Gaussian vectors (O(p·n²) per
        probe instead of O(n³)), replacing each norm by a bound that holds except
        with probability :data:`matroot.certify.probes.FAILURE_PROBABILITY` per matrix in
        all (``residual`` is then the probes' estimate of ``‖R‖_F/√n``). The sign
        test (a Cholesky of X, even p) is the same in both.
    probe_seed : int
        Seed of the randomized check's probes (for experiments on its failure
        rate; calls use the fixed :data:`matroot.certify.probes.PROBE_SEED`).

    Returns
    -------
    RootCheck

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.certify.verify import verify_root
    >>> a = np.diag([1.0, 0.25])[None]
    >>> good = verify_root(a, np.diag([1.0, 2.0])[None], 2, unit_roundoff=2**-53)
    >>> float(good.residual[0]), float(good.error_estimate[0]), bool(good.positive[0])
    (0.0, 0.0, True)
    >>> flipped = verify_root(a, np.diag([-1.0, 2.0])[None], 2, unit_roundoff=2**-53)
    >>> float(flipped.residual[0]), bool(flipped.positive[0])
    (0.0, False)
    """
    _check_stacks(scaled, root, certificate)
    xp = _xp.array_namespace(root)
    n = root.shape[-1]
    finite = _xp.finite_matrices(root)
    eye = _xp.identity_stack(xp, n, root.dtype, _xp.device_of(root))
    safe = _xp.symmetric_part(root)
    if _xp.is_traced(root) or not bool(xp.all(finite)):
        safe = _xp.batched_where(finite, safe, eye)
    if ritz is None and kappa_bound is not None:
        kappa, cost = kappa_from_root(scaled, safe, p, kappa_bound)
    else:
        kappa, cost = _ritz_kappa(ritz_values(scaled) if ritz is None else ritz, root)
    nan = xp.full_like(kappa, float("nan"))
    if isinstance(p, int) and certificate == "randomized":
        spectral, times_x, rms, blocks = _probed_norms(safe, scaled, p, probe_seed)
        residual = rms / math.sqrt(n)
        estimate = times_x / (p * _xp.frobenius_norm(safe))
        cost += blocks * PROBES / n
    elif isinstance(p, int):
        product, residual_matrix, count = _products(safe, scaled, p)
        residual = _xp.frobenius_norm(residual_matrix) / math.sqrt(n)
        estimate = (_xp.frobenius_norm(_xp.symmetric_part(product))
                    / (p * _xp.frobenius_norm(safe)))
        spectral = residual_spectral_norm(residual_matrix, symmetric=p % 2 == 0)
        cost += count + _SPECTRAL_MATVECS * (1 if p % 2 == 0 else 2) / n
    if isinstance(p, int):
        # An inverse (p = 1) that is accurate norm-wise has a residual X·A − I of up
        # to about n·u·κ (Higham, Accuracy and Stability, §14.1), not a balanced one.
        # The products' rounding scales with ‖X‖^p (≈ κ for a good root, ≤ ‖X‖_F^p):
        # an unstepped I at κ = 1e5 must not pass for rounding noise (issue 36).
        scale = xp.minimum(kappa, _xp.frobenius_norm(safe) ** p)
        floor = CHECK_FLOOR_FACTOR * (n if p == 1 else 1) * unit_roundoff * scale
        estimate = beyond_first_order(estimate, spectral, floor, p)
    else:
        residual = nan
        estimate = unit_roundoff * kappa / p
    positive = finite
    if not (isinstance(p, int) and p % 2 == 1):
        positive = positive & _xp.cholesky_succeeds(safe)
        cost += 1 / 6
    trusted = positive & xp.isfinite(estimate)
    estimate = xp.where(trusted, estimate, xp.full_like(estimate, float("inf")))
    return RootCheck(xp.where(finite, residual, nan), estimate, positive, kappa, cost)


def _ritz_kappa(ritz: RitzValues, root):
    """``θmax/θmin`` of a Lanczos run as a device array like ``root``, and the run's
    cost in matmul equivalents."""
    xp = _xp.array_namespace(root)
    low, high = ritz.low, ritz.high
    if not isinstance(low, np.ndarray):  # traced: the Ritz values stayed on the device
        kappa = xp.where(low > 0, high / xp.where(low > 0, low, xp.ones_like(low)),
                         xp.full_like(low, float("inf")))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            ritz_ratio = np.where(low > 0, high / low, np.inf)
        kappa = _xp.from_numpy(xp, ritz_ratio, dtype=root.dtype, device=_xp.device_of(root))
    n = root.shape[-1]
    return kappa, min(LANCZOS_STEPS, n) / n
