"""Upper bounds on λmax of symmetric stacks: randomized (a Lanczos run) or proven
(a Cholesky test).

Both start from a Krylov estimate θ ≤ λmax and differ in how they turn it into a
bound from above:

- :func:`randomized_lambda_max` (the default of :func:`matroot.lambda_max_bound`):
  ``θ/(1 − ε)`` with ε from Kuczyński and Woźniakowski's bound on Lanczos with a
  random start, so that it falls below λmax with probability at most
  :data:`FAILURE_PROBABILITY` per matrix. O(n²) per Lanczos step, no n³ work;
- :func:`certified_lambda_max`: a candidate proven by a floating-point Cholesky
  test (n³/3 flops each), never below λmax.

Both are capped by the guaranteed ``min(‖A‖_F, ‖A‖_∞)``. ``bound_certificate``
picks one (:data:`BOUND_CERTIFICATES`), with the same name wherever it is taken.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .. import _xp
from .._typing import Array
from .._xp import unit_roundoff
from .krylov import (LANCZOS_STEPS, POWER_MATVECS, RitzValues, _entry_scale, _power_scaled,
                     ritz_values)

__all__ = ["certified_lambda_max", "verified_upper", "CertifiedBound", "randomized_lambda_max",
           "randomized_margin", "schatten_lambda_max", "schatten_overestimate",
           "BOUND_CERTIFICATES", "DEFAULT_BOUND_CERTIFICATE",
           "FAILURE_PROBABILITY"]

#: ``bound_certificate`` values: a randomized Lanczos bound, or a Cholesky-proven one.
BOUND_CERTIFICATES = ("randomized", "cholesky")
#: The λmax bound :func:`matroot.inv_root` scales by when ``bound_certificate`` is not given.
DEFAULT_BOUND_CERTIFICATE = "cholesky"
#: Per matrix, the largest probability that :func:`randomized_lambda_max` is below λmax.
FAILURE_PROBABILITY = 1e-12
#: The constant of Kuczyński and Woźniakowski's bound (SIAM J. Matrix Anal. Appl.
#: 13(4), 1992, Theorem 4.2 for the Lanczos algorithm).
_LANCZOS_FAILURE_CONSTANT = 1.648
#: Rounding allowance of a Lanczos run in the compute dtype, in units of
#: ``(n + m)·u`` times the guaranteed bound (which is ≥ ‖A‖₂ for PSD A): the
#: products with A, the reorthogonalisation and the couplings the run drops, those
#: below its breakdown threshold ``n·ε`` (= 2n·u) times the largest ``‖v·A‖`` seen,
#: which is at most ‖A‖₂.
_LANCZOS_ROUNDING = 4.0

#: Power iteration returns a lower bound on λmax; this margin covers its shortfall.
POWER_SAFETY = 1.05

#: Factors tried on the power estimate, in order, until a Cholesky test certifies
#: one; past the last the guaranteed min(‖A‖_F, ‖A‖_∞) is used. 1.3 covers the
#: 20–25 % shortfall of an isolated top eigenvalue over a bulk at 0.75·λmax.
CERTIFY_FACTORS = (1.0, 1.3, 3.0)


class CertifiedBound(NamedTuple):
    """A certified λmax upper bound and what it cost (see :func:`certified_lambda_max`)."""

    bound: Array
    matmul_equivalents: Array


def _guaranteed_bound(xp, b):
    """min(‖B‖_F, ‖B‖_∞) with a relative margin for the rounding of the sums."""
    n = b.shape[-1]
    u = unit_roundoff(xp, b.dtype)
    frob = _xp.frobenius_norm(b)
    inf_norm = xp.max(xp.sum(xp.abs(b), axis=-1), axis=-1)
    return xp.minimum(frob, inf_norm) * (1 + 2 * (n + 2) * u)


def verified_upper(a: Array, bound: Array) -> Array:
    """Per matrix: is ``λmax(a) < bound`` proved by a floating-point Cholesky test?

    ``bound·I − a`` is positive definite exactly when ``λmax(a) < bound``. By
    Rump's verification of positive definiteness (BIT 46, 2006), a floating-point
    Cholesky factorisation that succeeds on ``C − s·I`` with
    ``s ≥ (n+1)·u·max_i C_ii/(1 − (n+1)·u)`` proves ``C`` positive definite;
    ``s = 2(n+2)·u·max_i C_ii`` is used, which also covers the rounding of
    forming ``C``. Cost: one batched Cholesky, n³/3 flops (1/6 of a matmul).
    """
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    u = unit_roundoff(xp, a.dtype)
    # The largest diagonal entry of bound·I − a is bound − min a_ii.
    diag_max = bound - xp.min(xp.linalg.diagonal(a), axis=-1)
    margin = 2 * (n + 2) * u * xp.maximum(diag_max, xp.zeros_like(diag_max))
    eye = _xp.identity_stack(xp, n, a.dtype, _xp.device_of(a))
    shift = (bound - margin)[..., None, None]
    return _xp.cholesky_succeeds(_xp.scaled_plus_identity(-a, 1.0, (shift,), eye,
                                                               overwrite=True))


def certified_lambda_max(a: Array, /, *, safety: float = POWER_SAFETY,
                         estimate: Array | None = None) -> CertifiedBound:
    """A proven upper bound on λmax of each symmetric matrix of a ``(b, n, n)`` stack.

    Power iteration (:func:`power_iteration`) gives a *lower* bound θ ≤ λmax: a
    Krylov method cannot see an eigenvector its start vectors miss, so no margin
    on θ alone is a proof. The candidate ``c = safety·θ·f`` (f from
    :data:`CERTIFY_FACTORS`) is kept only where :func:`verified_upper` proves
    ``λmax < c``; matrices no candidate certifies get the guaranteed
    ``min(‖A‖_F, ‖A‖_∞)`` (both ≥ λmax for symmetric A). The result is never
    below the true λmax (up to the rounding of the input itself) and, where the
    power estimate is good, within ``safety`` of it. A further factor is tried
    only when some matrix of the stack failed the previous one (one host check
    per factor, none inside any solver loop).

    ``estimate``, shape (b,), replaces the power iteration's θ by another lower
    estimate of λmax, e.g. the largest Ritz value of a Lanczos run the caller
    needs anyway (:func:`ritz_values`; 64 steps from one vector resolve the top
    better than 12 steps of 4). Only the Cholesky test makes a candidate the
    bound, so a poor estimate costs tightness, never the guarantee.

    Returns
    -------
    CertifiedBound
        ``bound`` (0 only for all-zero matrices) and ``matmul_equivalents``, the
        per-matrix cost in n×n matmuls: ``num_vectors·num_iter/n`` for the power
        iteration (none with ``estimate``) plus 1/6 per Cholesky test.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.spectrum.scaling import certified_lambda_max
    >>> h = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]) / 2
    >>> a = (h * [1.0, 0.75, 0.75, 1e-4]) @ h.T         # eigenvalues 1, 0.75, 0.75, 1e-4
    >>> cert = certified_lambda_max(a[None])
    >>> bool(1.0 <= float(cert.bound[0]) <= 1.05), float(cert.matmul_equivalents[0])
    (True, 12.166666666666666)
    """
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    scale = _entry_scale(xp, a)
    b = a / scale[..., None, None]
    guaranteed = _guaranteed_bound(xp, b)
    if estimate is None:
        estimate, cost = _power_scaled(b) * safety, POWER_MATVECS / n
    else:
        estimate, cost = estimate / scale * safety, 0.0
    bound = guaranteed
    open_ = xp.ones(guaranteed.shape, dtype=xp.bool, device=_xp.device_of(a))
    cost = xp.zeros_like(guaranteed) + cost
    traced = _xp.is_traced(a)
    for factor in CERTIFY_FACTORS:
        candidate = estimate * factor
        trying = open_ & (candidate < guaranteed)
        # Traced, nothing can be read: every factor is tried (a Cholesky each).
        if not traced and not bool(xp.any(trying)):
            break
        proved = trying & verified_upper(b, candidate)
        bound = xp.where(proved, candidate, bound)
        cost = cost + xp.astype(trying, cost.dtype) / 6
        open_ = open_ & ~proved
    return CertifiedBound(bound * scale, cost)



def randomized_margin(n: int, steps: int,
                      failure_probability: float = FAILURE_PROBABILITY) -> float:
    """The relative shortfall ε that an m-step Lanczos run exceeds with probability ≤ δ.

    Kuczyński and Woźniakowski (1992) bound, for a symmetric positive
    semidefinite ``n×n`` A and a start vector uniform on the unit sphere, the
    probability that k Lanczos matrix-vector products leave the largest Ritz
    value θ below ``(1 − ε)·λmax``: ``P(θ < (1 − ε)·λmax) ≤ 1.648·√n·e^(−√ε·(2k − 1))``,
    for every spectrum. Setting the right side to δ gives
    ``ε = (ln(1.648·√n/δ)/(2k − 1))²``. The run of :func:`matroot.spectrum.krylov.ritz_values`
    builds an m-dimensional Krylov space from m − 1 products beyond the start
    vector, so ``k = m − 1`` is used (the smaller k of the two readings of the
    paper's step count, so the larger ε). With ``m = n`` the space is the whole
    space and ε = 0; where ε ≥ 1 there is no bound (1 is returned).

    Examples
    --------
    >>> from matroot.spectrum.lambda_max_bounds import randomized_margin
    >>> round(randomized_margin(384, 64), 4), randomized_margin(48, 64)
    (0.0619, 0.0)
    """
    if steps >= n:
        return 0.0
    products = steps - 1
    if products < 1:
        return 1.0
    root = math.log(_LANCZOS_FAILURE_CONSTANT * math.sqrt(n) / failure_probability)
    return min(1.0, (root / (2 * products - 1)) ** 2)


def _norm_bounds(xp, b):
    """Per matrix of an entry-scaled stack: the guaranteed ``min(‖B‖_F, ‖B‖_∞)`` (with
    a margin for the rounding of the sums) and a lower bound on λmin, the Gershgorin
    ``min_i (b_ii − Σ_{j≠i} |b_ij|)`` where positive, else 0."""
    n = b.shape[-1]
    u = unit_roundoff(xp, b.dtype)
    # One |b| pass serves the ∞-norm and the Gershgorin discs.
    rows = xp.sum(xp.abs(b), axis=-1)
    grown = 1 + 2 * (n + 2) * u
    guaranteed = xp.minimum(_xp.frobenius_norm(b), xp.max(rows, axis=-1)) * grown
    diagonal = xp.linalg.diagonal(b)
    # b_ii − (R_i − |b_ii|); the extra 4u·R_i covers the subtraction's rounding.
    disc = 2 * xp.maximum(diagonal, xp.zeros_like(diagonal)) - rows * (grown + 4 * u)
    lowest = xp.min(disc, axis=-1) * (1 - 4 * u)
    return guaranteed, xp.maximum(lowest, xp.zeros_like(lowest))


def randomized_lambda_max(a: Array, /, *, ritz: RitzValues | None = None,
                          num_steps: int = LANCZOS_STEPS,
                          failure_probability: float = FAILURE_PROBABILITY) -> CertifiedBound:
    """An upper bound on λmax of each PSD matrix of a ``(b, n, n)`` stack, from one Lanczos run.

    With θ the largest Ritz value of an m-step Lanczos run from a random start
    and ε = :func:`randomized_margin` ``(n, m, δ)``, ``θ < (1 − ε)·λmax`` has
    probability at most δ (``failure_probability``). The theorem is for PSD
    matrices; it is applied to ``A − g·I``, with g ≥ 0 the Gershgorin lower bound on
    λmin (0 unless A is diagonally dominant), which has the same eigenvectors and
    is PSD for PSD A. So, except with probability δ,
    ``λmax − g ≤ (θ − g)/(1 − ε)`` and

        ``λmax ≤ g + (θ + ρ − g)/(1 − ε)``,

    where ρ = ``4·(n + m)·u·G`` allows for the run's rounding (G the guaranteed
    bound below). The result is capped by ``G = min(‖A‖_F, ‖A‖_∞)`` (both ≥ λmax
    for symmetric A), which is also what a matrix gets where ε ≥ 1. Where
    ``m = n`` (n ≤ :data:`~matroot.spectrum.krylov.LANCZOS_STEPS` by default) the Krylov
    space is the whole space and the bound holds with certainty.

    The probability is over the start vector, which is a fixed-seed draw (so
    that results are reproducible): it holds for any matrix that does not depend
    on that draw. A bound that falls short costs convergence, never a wrong root
    reported as converged: the scaled spectrum then reaches past 1 and the
    a-posteriori check of the root (:mod:`matroot.certify.verify`) judges what comes out.
    ``bound_certificate="cholesky"`` (:func:`certified_lambda_max`) is the
    deterministic alternative.

    Parameters
    ----------
    a : array, shape (b, n, n)
        Symmetric positive semidefinite matrices.
    ritz : RitzValues, optional
        :func:`matroot.spectrum.krylov.ritz_values` of ``a``, when the caller has run it
        (then nothing but O(n²) norms is spent here).
    num_steps : int
        Lanczos steps of the run made here when ``ritz`` is not given.
    failure_probability : float
        δ, per matrix.

    Returns
    -------
    CertifiedBound
        ``bound`` and ``matmul_equivalents``: the run's ``m/n`` when made here, else 0.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.spectrum.lambda_max_bounds import randomized_lambda_max
    >>> lam = np.linspace(0.01, 1.0, 200)
    >>> q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((200, 200)))
    >>> out = randomized_lambda_max(((q * lam) @ q.T)[None])
    >>> bool(1.0 <= float(out.bound[0]) <= 1.1), float(out.matmul_equivalents[0])
    (True, 0.32)
    """
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    dev = _xp.device_of(a)
    cost = 0.0
    if ritz is None:
        ritz = ritz_values(a, num_steps=num_steps)
        cost = ritz.steps / n
    scale = _entry_scale(xp, a)
    guaranteed, shift = _norm_bounds(xp, a / scale[..., None, None])
    top = ritz.high if _xp.is_traced(a) else _xp.from_numpy(xp, ritz.high, dtype=a.dtype,
                                                             device=dev)
    top = xp.reshape(top, scale.shape) / scale
    shortfall = randomized_margin(n, ritz.steps, failure_probability)
    rounding = _LANCZOS_ROUNDING * (n + ritz.steps) * unit_roundoff(xp, a.dtype)
    bound = guaranteed
    if shortfall < 1:
        top = xp.maximum(top, shift) + rounding * guaranteed
        bound = xp.minimum(shift + (top - shift) / (1 - shortfall), guaranteed)
    return CertifiedBound(bound * scale, xp.zeros_like(bound) + cost)


#: The Schatten norm :func:`schatten_lambda_max` forms: ``‖A‖_{S8} = ‖A⁴‖_F^(1/4)``.
SCHATTEN_ORDER = 8


def schatten_overestimate(n: int, unit: float) -> float:
    """The most :func:`schatten_lambda_max` can exceed λmax by, for a PSD ``n×n`` matrix:
    ``n^(1/8)`` (all eigenvalues equal) times its rounding margin.

    Examples
    --------
    >>> from matroot.spectrum.lambda_max_bounds import schatten_overestimate
    >>> round(schatten_overestimate(384, 2.0 ** -24), 3)
    2.104
    """
    return max(n, 1) ** (1.0 / SCHATTEN_ORDER) * (1 + 4 * max(n, 1) * unit)


def schatten_lambda_max(a: Array, *, times: float = 1.0) -> Array:
    """An upper bound on λmax of each PSD matrix of a ``(b, n, n)`` stack in two products.

    ``‖A‖_{S8} = (Σ λᵢ⁸)^(1/8) = ‖A⁴‖_F^(1/4)`` lies in ``[λmax, n^(1/8)·λmax]``
    (:func:`schatten_overestimate`): unlike a Krylov estimate its distance from λmax
    is known before the stack is read, which is what lets a fixed-step solve
    (:mod:`matroot.solvers.fixed_steps`) choose its step count on the host. ``A⁴`` is
    formed as ``(A·A)²``; the factor ``1 + 4n·u`` covers the rounding of the
    products and the norm in practice (the worst-case bound, ``3n²u``, is far
    looser), and a bound that falls short by less than 21 % is inside every
    iteration's basin, while the check of the root judges what comes out. The caller
    keeps the entries O(1) (matroot divides by a power of two first); ``times``
    multiplies the result (on the first product: no pass of its own).

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.spectrum.lambda_max_bounds import schatten_lambda_max
    >>> a = np.diag([1.0, 0.5, 0.25])[None]
    >>> bool(1.0 <= float(schatten_lambda_max(a)[0]) <= 1.01)
    True
    """
    xp = _xp.array_namespace(a)
    n = a.shape[-1]
    u = unit_roundoff(xp, a.dtype)
    # The margin rides on the first product: (c²·A²)² = c⁴·A⁴.
    square = _xp.add_product(a, a, a, beta=0.0, alpha=((1 + 4 * n * u) * times) ** 2)
    fourth = _xp.frobenius_norm(_xp.batched_matmul(square, square))
    # Square roots, correctly rounded everywhere (a pow could differ in the last bit
    # with a matrix's position in the batch).
    return xp.sqrt(xp.sqrt(fourth))
