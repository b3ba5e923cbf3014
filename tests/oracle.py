"""The float64 eigendecomposition oracle and SPD stacks with a chosen spectrum."""

from __future__ import annotations

import numpy as np


def random_orthogonal(rng, batch, n):
    q, r = np.linalg.qr(rng.standard_normal((*batch, n, n)))
    # Sign fix so Q is Haar-distributed rather than biased by QR's convention.
    return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def spd_stack(rng, batch, n, kappa, *, lam_max=1.0, spread="geometric"):
    """Stack of SPD matrices Q diag(λ) Qᵀ with λmax = lam_max and λmax/λmin = kappa.

    Returns ``(a, q, lam)`` in float64.
    """
    batch = tuple(batch)
    if n == 1:
        lam = np.full((*batch, 1), lam_max)
    elif spread == "geometric":
        lam = np.broadcast_to(np.geomspace(lam_max / kappa, lam_max, n), (*batch, n))
    else:
        inner = rng.uniform(lam_max / kappa, lam_max, (*batch, n - 2))
        lam = np.concatenate([np.full((*batch, 1), lam_max / kappa), inner,
                              np.full((*batch, 1), lam_max)], axis=-1)
    q = random_orthogonal(rng, batch, n)
    a = (q * lam[..., None, :]) @ np.swapaxes(q, -1, -2)
    return (a + np.swapaxes(a, -1, -2)) / 2, q, np.array(lam)


def oracle_inv_root(a, p, eps=0.0):
    """(A + eps·I)^(-1/p) of the given values, in float64 via eigh."""
    a = np.asarray(a, dtype=np.float64)
    a = (a + np.swapaxes(a, -1, -2)) / 2 + eps * np.eye(a.shape[-1])
    lam, q = np.linalg.eigh(a)
    return (q * lam[..., None, :] ** (-1.0 / p)) @ np.swapaxes(q, -1, -2)


def relative_error(x, ref):
    """Per-matrix relative Frobenius error ‖x − ref‖_F / ‖ref‖_F."""
    x = np.asarray(x, dtype=np.float64)
    return np.linalg.norm(x - ref, axis=(-2, -1)) / np.linalg.norm(ref, axis=(-2, -1))
