"""Spectrum families: float64 SPD stacks with λmax = 1 and a chosen condition number.

Every family maps ``(rng, batch, n, kappa)`` to a symmetric float64 stack
``B[*batch, n, n]`` whose eigenvalues lie in ``[1/kappa, 1]`` with both ends attained
(in exact arithmetic). :func:`matroot.testing.spd_stacks` scales these, subtracts a
ridge and records the float64 eigendecomposition of what it hands out.

Examples
--------
>>> import numpy as np
>>> from matroot.testing.spectra import family_stack
>>> b = family_stack("kms", np.random.default_rng(0), (2,), 5, 1e3)
>>> lam = np.linalg.eigvalsh(b)
>>> bool(np.allclose(lam.max(-1), 1.0)), bool(np.allclose(lam.max(-1) / lam.min(-1), 1e3))
(True, True)
"""

from __future__ import annotations

import math

from collections.abc import Callable

import numpy as np

__all__ = [
    "ADVERSARIAL_FAMILIES",
    "FAMILIES",
    "MATRIX_FAMILIES",
    "SPECTRAL_FAMILIES",
    "bulk_spectrum",
    "family_stack",
    "random_orthogonal",
    "spectrum",
]

Spectrum = Callable[[np.random.Generator, tuple, int, float], np.ndarray]


def random_orthogonal(rng: np.random.Generator, batch: tuple, n: int) -> np.ndarray:
    """Haar-distributed orthogonal matrices of shape ``(*batch, n, n)``."""
    q, r = np.linalg.qr(rng.standard_normal((*batch, n, n)))
    # Sign fix so Q is Haar-distributed rather than biased by QR's convention.
    return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def _with_ends(inner: np.ndarray, kappa: float) -> np.ndarray:
    """Sorted spectrum made of ``inner`` plus the pinned ends 1/kappa and 1."""
    ends = np.broadcast_to(np.array([1.0 / kappa, 1.0]), (*inner.shape[:-1], 2))
    return np.sort(np.concatenate([ends, np.clip(inner, 1.0 / kappa, 1.0)], axis=-1), axis=-1)


def _geometric(rng, batch, n, kappa):
    return np.broadcast_to(np.geomspace(1.0 / kappa, 1.0, n), (*batch, n)).copy()


def _uniform(rng, batch, n, kappa):
    return _with_ends(rng.uniform(1.0 / kappa, 1.0, (*batch, n - 2)), kappa)


def _clustered(rng, batch, n, kappa):
    # Two to four tight clusters (relative width 1e-3), one at each end, the others
    # log-uniform in between.
    centres = np.concatenate([[1.0 / kappa, 1.0],
                              kappa ** -rng.uniform(0.0, 1.0, int(rng.integers(0, 3)))])
    picks = centres[rng.integers(0, len(centres), (*batch, n - 2))]
    return _with_ends(picks * (1.0 + 1e-3 * rng.uniform(-1.0, 1.0, picks.shape)), kappa)


def _isolated_top(rng, batch, n, kappa):
    # λ1 = 1 over a bulk repeated exactly at 0.5–0.99, with a tail of about n/8 down to
    # 1/κ: a random start vector holds ~1/n of the top eigenvector and each power step
    # shrinks the bulk only by λ2/λ1, so power iteration falls short most here.
    second = max(1.0 / kappa, rng.uniform(0.5, 0.99))
    inner = np.full((*batch, n - 2), second)
    tail = min(n - 2, max(0, n // 8 - 1))
    if tail:
        inner[..., :tail] = np.geomspace(1.0 / kappa, second, tail + 2)[1:-1]
    return _with_ends(inner, kappa)


def _tiny_one(rng, batch, n, kappa):
    # One small eigenvalue under a well-conditioned bulk in [0.1, 1].
    return _with_ends(rng.uniform(max(1.0 / kappa, 0.1), 1.0, (*batch, n - 2)), kappa)


def _flat_bulk(rng, batch, n, kappa):
    # A bulk exactly at λmax over one small eigenvalue (a second one, drawn within a
    # decade above it, half the time): the rounding floor u·κ/p sits in one direction,
    # and ‖A − I‖_F/√n ≈ 1/√n lets an unstepped I pass a Frobenius stop test (issue 36).
    inner = np.ones((*batch, n - 2))
    if n > 2:
        second = np.minimum(10.0 ** rng.uniform(0.0, 1.0, batch) / kappa, 1.0)
        inner[..., 0] = np.where(rng.random(batch) < 0.5, second, 1.0)
    return _with_ends(inner, kappa)


def _repeated(rng, batch, n, kappa):
    # Exactly repeated values: the ends and the geometric middle, with multiplicities.
    values = np.array([1.0 / kappa, kappa ** -0.5, 1.0])
    return _with_ends(values[rng.integers(0, 3, (*batch, n - 2))], kappa)


#: Families defined by their spectrum, in a random orthogonal basis.
SPECTRAL_FAMILIES: dict[str, Spectrum] = {
    "geometric": _geometric,
    "uniform": _uniform,
    "clustered": _clustered,
    "isolated_top": _isolated_top,
    "tiny_one": _tiny_one,
    "repeated": _repeated,
    "flat_bulk": _flat_bulk,
    "scale_extremes": _geometric,
    "small": _geometric,
}


def spectrum(family: str, rng: np.random.Generator, batch: tuple, n: int,
             kappa: float) -> np.ndarray:
    """Sorted eigenvalues ``(*batch, n)`` of a spectral family, in ``[1/kappa, 1]``.

    Raises
    ------
    ValueError
        For a family that is not spectral or a kappa below 1.
    """
    if family not in SPECTRAL_FAMILIES:
        raise ValueError(f"{family!r} is not a spectral family; choose from "
                         f"{tuple(SPECTRAL_FAMILIES)}")
    if not 1 <= kappa < math.inf:
        raise ValueError(f"kappa={kappa!r}: a condition number is at least 1 and finite")
    if n == 1:
        return np.ones((*batch, 1))
    return SPECTRAL_FAMILIES[family](rng, tuple(batch), n, kappa)


def bulk_spectrum(n: int, kappa: float) -> np.ndarray:
    """``n`` eigenvalues in ``[1/kappa, 1]``, sorted: a dense top with a thin tail.

    Seven eighths of them (all but two for n < 16) lie evenly in ``(1/2, 1]``
    and the rest geometrically from 1/2 down to ``1/kappa``, both ends attained:
    a Shampoo factor plus a ridge. Its Frobenius norm is about √n/2 times its λmax
    (about √(n / (2 ln κ)) times for the geometric family), so a Frobenius scaling
    starts a solver far from the top. It is not one of :data:`FAMILIES`, which the
    hypothesis searches draw from; :func:`matroot.testing.scaled_spd_stack` offers it.

    Examples
    --------
    >>> from matroot.testing.spectra import bulk_spectrum
    >>> bulk_spectrum(8, 1e3).round(3).tolist()
    [0.001, 0.5, 0.583, 0.667, 0.75, 0.833, 0.917, 1.0]
    """
    if n <= 2:
        return np.geomspace(1.0 / kappa, 1.0, n) if n == 2 else np.ones(n)
    tail = max(2, n // 8)  # two at least, so that 1/kappa is attained
    top = np.linspace(1.0, 0.5, n - tail, endpoint=False)
    return np.concatenate([top, np.geomspace(0.5, 1.0 / kappa, tail)])[::-1]


def _hilbert(rng, n):
    i = np.arange(n)
    return 1.0 / (i[:, None] + i[None, :] + 1.0)


def _lehmer(rng, n):
    i = np.arange(1.0, n + 1.0)
    return np.minimum.outer(i, i) / np.maximum.outer(i, i)


def _kms(rng, n):
    rho = rng.uniform(0.1, 0.95)
    i = np.arange(n)
    return rho ** np.abs(i[:, None] - i[None, :])


def _tridiagonal(rng, n):
    return 2.0 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)


def _gram(rng, n):
    # Shampoo's factor: EMA (or plain sum when beta = 1) of rank-r Gram matrices G Gᵀ,
    # total rank below n so that only the ridge makes it definite.
    steps = min(int(rng.integers(1, 4)), n - 1)
    rank = max(1, (n - 1) // max(steps, 1))
    beta = float(rng.choice([1.0, 0.9, 0.999]))
    total = np.zeros((n, n))
    for _ in range(steps):
        g = rng.standard_normal((n, rank)) * rng.lognormal(0.0, 1.0, rank)
        total = beta * total + (1.0 - beta if beta < 1 else 1.0) * (g @ g.T)
    return total


#: Families defined by a matrix; a shift of the identity sets κ, the structure stays.
MATRIX_FAMILIES: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "gram": _gram,
    "hilbert": _hilbert,
    "lehmer": _lehmer,
    "kms": _kms,
    "tridiagonal": _tridiagonal,
}

#: Every family name, the first (geometric) being where hypothesis shrinks to.
FAMILIES: tuple[str, ...] = (*SPECTRAL_FAMILIES, *MATRIX_FAMILIES)
#: The spectra that most easily fool a λmax estimate or a coupled residual.
ADVERSARIAL_FAMILIES: tuple[str, ...] = ("isolated_top", "clustered", "gram", "flat_bulk")


def _shifted_to_kappa(m: np.ndarray, kappa: float) -> np.ndarray:
    """``(m + s·I) / λmax`` with the shift s that makes κ = kappa (s may be negative)."""
    lam = np.linalg.eigvalsh(m)
    top, bottom = lam[-1], lam[0]
    if kappa <= 1.0 or top <= bottom:
        return np.eye(len(m))
    shift = (top - kappa * bottom) / (kappa - 1.0)
    return (m + shift * np.eye(len(m))) / (top + shift)


def family_stack(family: str, rng: np.random.Generator, batch: tuple, n: int,
                 kappa: float) -> np.ndarray:
    """A float64 stack ``(*batch, n, n)`` of the family with λmax = 1 and κ = kappa.

    Raises
    ------
    ValueError
        For an unknown family name (the message lists the known ones).
    """
    batch = tuple(batch)
    if family in MATRIX_FAMILIES:
        mats = [_shifted_to_kappa(MATRIX_FAMILIES[family](rng, n), kappa)
                for _ in range(int(np.prod(batch, dtype=int)))]
        return np.reshape(np.array(mats), (*batch, n, n))
    if family not in SPECTRAL_FAMILIES:
        raise ValueError(f"unknown spectrum family {family!r}; choose from {FAMILIES}")
    lam = spectrum(family, rng, batch, n, kappa)
    if family == "repeated" and rng.random() < 0.5:
        # A signed permutation keeps the repeated eigenvalues exact in any precision.
        q = np.eye(n)[rng.permutation(n)] * rng.choice([-1.0, 1.0], n)
    else:
        q = random_orthogonal(rng, batch, n)
    b = (q * lam[..., None, :]) @ np.swapaxes(q, -1, -2)
    return (b + np.swapaxes(b, -1, -2)) / 2
