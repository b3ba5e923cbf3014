"""The check of a fixed-step solve's roots in a handful of batched products.

The same quantities as :func:`matroot.certify.verify.verify_root` (the residual
``R = X^(p/2)·A·X^(p/2) − I`` for even p, ``X^p·A − I`` for odd p; the first-order
estimate, corrected beyond first order by
:func:`~matroot.certify.verify.beyond_first_order`; the Cholesky sign test for even
p), each in the fewest operations, with the two vector loops of that check replaced:

- the first-order estimate ``‖sym(R·X)‖_F/(p·‖X‖_F)`` is bounded from above by
  ``‖R·X‖_F/(p·‖X‖_F)`` (the symmetric part is a projection; the two differ by the
  commutator of R and X, rounding noise for a root of A): one pass fewer, and only
  stricter;
- the residual's spectral norm, which decides whether the first-order estimate
  is trusted, is bounded from above by ``ρ = ‖R‖_F ≥ ‖R‖₂`` (formed for the
  residual anyway) instead of estimated from below by six power steps. Where
  ``ρ <`` :data:`LINEAR_REGIME`
  the estimate is multiplied by ``1 + c_p·ρ`` (:func:`growth_slope`), which is at
  least the exact factor ``sandwich_bound(ρ)/(ρ/p)`` of
  :func:`~matroot.certify.verify.beyond_first_order`; beyond, the estimate is
  not trusted (the adaptive check's sandwich bound there is
  at least 0.5 for p ≤ 2, so it could certify nothing either; for p ≥ 4 only a
  target rtol ≥ 0.19 loses). Every use of ρ grows with it, so the upper bound only
  makes the verdict stricter (at large n, near κ_max, it can cost a root that the
  adaptive check, with its estimate of ‖R‖₂ from below, would certify). The sign test
  is a penalty added to ρ (:func:`matroot._xp.failure_penalty`), so that one
  comparison decides both;
- κ, which picks how much of the error the estimate cannot see (``u·κ/p``), is
  ``θ^(p/q)`` for θ the largest growth of a few block power steps with
  ``P = X^q`` (``q = p/2``, or p for odd p; ``X^q`` is formed for the residual
  anyway) on an ``n × k`` block: :data:`KAPPA_STEPS` products with ``n × k``
  blocks, no normalisation between them. ``λmax(X)^p ≈ 1/λmin(A)`` and the scaled
  ``λmax(A) ≤ 1`` (the Schatten bound), so this estimates κ from above by at most
  the scale's overestimate and from below by the power steps' shortfall, like
  :func:`~matroot.certify.verify.kappa_from_root`; with an accuracy target ``rtol``
  (the only targets a fixed-step solve takes) a larger κ only tightens the verdict.
  θ is returned with its power, which the verdict folds into its own operation
  (:func:`~matroot.certify.accuracy.rtol_margin`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import _xp
from .._typing import Array
from .._xp import matrix_power, power_matmuls
from ..spectrum.krylov import _start_vectors
from .verify import LINEAR_REGIME, sandwich_bound

__all__ = ["KAPPA_STEPS", "KAPPA_VECTORS", "ProductCheck", "growth_slope", "product_check"]

#: Block power steps (products with an ``n × k`` block) behind κ.
KAPPA_STEPS = 3
#: Columns of that block.
KAPPA_VECTORS = 8


@_xp.host_constant
def growth_slope(p: int) -> float:
    """``c_p`` with ``sandwich_bound(ρ)/(ρ/p) ≤ 1 + c_p·ρ`` on ``(0, LINEAR_REGIME)``,
    from a fine grid with a 1 % margin (the ratio is convex in ρ).

    Examples
    --------
    >>> from matroot.certify.product_check import growth_slope
    >>> round(growth_slope(2), 3)
    2.079
    """
    rho = np.linspace(1e-6, LINEAR_REGIME, 20001)
    ratio = sandwich_bound(rho, p) / (rho / p)
    return float(np.max((ratio - 1) / rho)) * 1.01


def _kappa(power, factor: float):
    """θ per column, ``‖P·w‖/‖w‖`` over the columns of the last of :data:`KAPPA_STEPS`
    block power steps on ``factor·power`` (unnormalised; the largest is a lower estimate
    of ``λmax``; the factor rides on the last product), shape (b, k)."""
    xp = _xp.array_namespace(power)
    n = power.shape[-1]
    k = min(KAPPA_VECTORS, n)
    w = xp.broadcast_to(_start_vectors(xp, n, k, power.dtype, _xp.device_of(power)),
                        (power.shape[0], n, k))
    before = w
    for step in range(KAPPA_STEPS):
        last = step == KAPPA_STEPS - 1
        before, w = w, (_xp.add_product(w, power, w, beta=0.0, alpha=factor) if last
                        else _xp.batched_matmul(power, w))
    return xp.linalg.vector_norm(w, axis=-2) / xp.linalg.vector_norm(before, axis=-2)


class ProductCheck(NamedTuple):
    """What :func:`product_check` finds, per matrix (shape (b,)).

    ``residual``: ``‖R‖_F/√n``. ``estimate``: the first-order estimate of the root's
    relative error, to be taken only where the root is trusted. ``trust``: below the
    check's ``limit`` exactly where it is (the sign test passed and the residual is in
    the first-order regime; NaN or at least 1 where the sign test failed), on the scale
    of a verdict that compares a margin with ``limit``, so that one ``maximum`` joins the
    two tests. ``kappa_roots``: θ per column of the block power steps, shape (b, k), with
    ``κ = max θ^kappa_power`` (``kappa_power`` 1 or 2, a host integer), so that a
    verdict can fold the power, and the largest column, into its own operations.
    ``root_norm``: ``‖matrix‖_F``. ``matmul_equivalents``: the check's cost in n×n
    products.
    """

    residual: Array
    estimate: Array
    trust: Array
    kappa_roots: Array
    kappa_power: int
    matmul_equivalents: float
    root_norm: Array

    @property
    def kappa(self) -> Array:
        """κ itself, shape (b,)."""
        xp = _xp.array_namespace(self.kappa_roots)
        theta = xp.max(self.kappa_roots, axis=-1)
        return theta if self.kappa_power == 1 else theta ** 2


def product_check(scaled, matrix, p: int, *, unit_roundoff: float,
                  factor: float = 1.0, scaled_factor: float = 1.0,
                  limit: float = 1.0) -> ProductCheck:
    """Check symmetric roots ``factor·matrix ≈ scaled^(-1/p)`` (integer p) in batched products.

    Parameters
    ----------
    scaled : array, shape (b, n, n)
        The regularised, scaled symmetric stack (spectrum in (0, 1]).
    matrix : array, shape (b, n, n)
        Symmetric, a positive multiple of the roots: the roots are ``factor·matrix``
        (a host scalar the products take in their ``alpha`` instead of a pass).
    p : int
        Root order.
    unit_roundoff : float
        u of the compute dtype.
    factor : float
        The positive host factor of the roots.
    scaled_factor : float
        The stack is ``scaled_factor·scaled`` (a host factor too).
    limit : float
        The scale of ``trust``, in (0, 1].

    Returns
    -------
    ProductCheck
        ``matmul_equivalents`` counts the n×n products, the Cholesky (1/6) and the
        block products (k/n each).

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.certify.product_check import product_check
    >>> a = np.diag([1.0, 0.25])[None]
    >>> good = product_check(a, np.diag([1.0, 2.0])[None], 2, unit_roundoff=2**-53)
    >>> float(good.residual[0]), float(good.estimate[0]), bool(good.trust[0] < 1)
    (0.0, 0.0, True)
    >>> half = product_check(a, np.diag([0.5, 1.0])[None], 2, unit_roundoff=2**-53, factor=2.0)
    >>> float(half.residual[0]), round(float(half.kappa[0]), 2)
    (0.0, 4.0)
    >>> wrong = product_check(a, np.diag([-1.0, 2.0])[None], 2, unit_roundoff=2**-53)
    >>> bool(wrong.trust[0] < 1)
    False
    """
    if not 0 < limit <= 1:
        raise ValueError(f"product_check: limit must be in (0, 1], got {limit!r}")
    xp = _xp.array_namespace(matrix)
    n = matrix.shape[-1]
    eye = _xp.shared_identity(xp, n, matrix.dtype, _xp.device_of(matrix))
    plain = _xp.Matmul(xp)
    odd = p % 2 == 1
    q = p if odd else p // 2
    power = matrix_power(matrix, q, plain)  # X^q = factor^q · power
    # R/√n: the residual field as it stands; ρ = √n·‖R/√n‖_F below.
    root_n = math.sqrt(n)
    if odd:
        residual = _xp.add_product(eye, power, scaled, beta=-1.0 / root_n,
                                   alpha=factor ** q * scaled_factor / root_n)
        count = power_matmuls(p) + 2
    else:
        residual = _xp.add_product(eye, _xp.batched_matmul(power, scaled), power,
                                   beta=-1.0 / root_n,
                                   alpha=factor ** (2 * q) * scaled_factor / root_n)
        count = power_matmuls(q) + 3
    # ‖R‖_F ≥ ‖R‖₂ stands for the residual's spectral norm ρ (an upper bound: every use
    # of ρ below grows with it, so the verdict is only stricter).
    normalised = _xp.frobenius_norm(residual)  # ρ/√n
    # ‖R·X‖_F/(p‖X‖_F) (the factor cancels; the √n/p rides on the product) bounds the
    # first-order estimate ‖sym(R·X)‖_F/(p‖X‖_F) from above (a symmetric part is a
    # projection), one pass fewer; then times 1 + c_p·ρ.
    product = _xp.add_product(eye, residual, matrix, beta=0.0, alpha=root_n / p)
    matrix_norm = _xp.frobenius_norm(matrix)
    first_order = _xp.frobenius_norm(product) / matrix_norm
    estimate = _xp.add_product_of(first_order, growth_slope(p) * root_n, first_order,
                                  normalised)
    thetas = _kappa(power, factor ** q)
    # The regime ρ < LINEAR_REGIME on the limit's scale, plus the sign test (Cholesky for
    # even p, finiteness for odd) as a penalty of at least 1 ≥ limit, or NaN: one
    # operation, and one comparison decides both.
    penalty = _xp.failure_penalty(matrix, definite=not odd)
    trust = _xp.add_scaled(penalty, limit * root_n / LINEAR_REGIME, normalised)
    cost = count + 1 + (0 if odd else 1 / 6) + KAPPA_STEPS * min(KAPPA_VECTORS, n) / n
    return ProductCheck(normalised, estimate, trust, thetas, 1 if p == q else 2, cost,
                        matrix_norm)
