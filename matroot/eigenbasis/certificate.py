"""What decides ``converged`` for an eigenbasis: the exact residual, the rounding
allowance, and (where a method cannot guarantee it) a probed bound on ``‖QᵀQ − I‖_F``.

For a basis ``Q`` with Rayleigh quotients ``d`` and ``R = A·Q − Q·diag(d)``, and
``η = ‖QᵀQ − I‖_F``, ``‖A − Q·diag(d)·Qᵀ‖_F ≤ ‖R‖_F·(1 + η) + ‖A‖₂·η`` (docs/eigenbasis.rst),
so a matrix is converged where ``‖R‖_F/‖A‖_F + η_bound + allowance ≤ rtol``.
"""

from __future__ import annotations

import math

from .. import _xp
from ..certify.probes import frobenius_factor, probe_block

__all__ = ["ALLOWANCE_FACTOR", "PROBES", "PROBE_FAILURE", "PROBE_SEED", "rounding_allowance",
           "rayleigh_quotients", "relative_residual", "orthogonality_bound"]

#: The rounding allowance in units of (n + 2)·u (see :func:`rounding_allowance`).
ALLOWANCE_FACTOR = 4.0
#: Gaussian probe vectors for the orthogonality bound, their seed, and the probability
#: (per matrix) that the bound comes out too low.
PROBES = 16
PROBE_SEED = 38
PROBE_FAILURE = 1e-12


def rounding_allowance(n: int, unit_roundoff: float) -> float:
    """What rounding may hide from the computed residual: ``ALLOWANCE_FACTOR·(n + 2)·u``.

    The computed residual of a basis differs from its exact one by the rounding of
    ``A·Q`` and of the Rayleigh quotients, and the bases that Householder QR and
    eigh return are orthonormal only to ``‖QᵀQ − I‖_F`` of about ``n·u`` (measured
    up to 0.9·n·u for torch's float32 eigh at n = 1024, 3.3·n·u for its float64 one
    at n = 10); both move the promised error by this order.

    Examples
    --------
    >>> round(rounding_allowance(1024, 2.0 ** -24), 6)
    0.000245
    """
    return ALLOWANCE_FACTOR * (max(n, 0) + 2) * unit_roundoff


def rayleigh_quotients(q, z):
    """Per column ``qᵢᵀzᵢ / qᵢᵀqᵢ`` (0 for a zero column)."""
    xp = _xp.array_namespace(q)
    squares = xp.sum(q * q, axis=-2)
    squares = xp.where(squares > 0, squares, xp.ones_like(squares))
    return xp.sum(q * z, axis=-2) / squares


def relative_residual(q, z, d, norm):
    """``‖Z − Q·diag(d)‖_F / norm`` per matrix (``Z = (A + σI)·Q``, ``d`` its quotients)."""
    return _xp.frobenius_norm(z - q * d[:, None, :]) / norm


def orthogonality_bound(q):
    """Per matrix, a bound on ``‖QᵀQ − I‖_F`` from two thin products with :data:`PROBES`
    fixed Gaussian vectors; too low with probability at most :data:`PROBE_FAILURE`."""
    xp = _xp.array_namespace(q)
    n = q.shape[-1]
    omega = probe_block(xp, n, q.dtype, _xp.device_of(q), probes=PROBES, seed=PROBE_SEED)
    defect = xp.matrix_transpose(q) @ (q @ omega) - omega
    return frobenius_factor(PROBES, PROBE_FAILURE) * _xp.frobenius_norm(defect) / math.sqrt(PROBES)
