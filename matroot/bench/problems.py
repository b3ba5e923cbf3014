"""Test matrices with a known spectral spread, and the float64 eigh oracle they are judged by."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["spd_stack", "spectrum", "SPECTRA", "Oracle", "relative_errors"]


SPECTRA = ("geometric", "bulk")


def spectrum(n: int, kappa: float, kind: str = "geometric") -> np.ndarray:
    """``n`` eigenvalues from 1 down to ``1/kappa``, largest first.

    ``"geometric"`` spaces them evenly in log scale. ``"bulk"`` puts seven
    eighths of them evenly in [1/2, 1] and the rest geometrically from 1/2 to
    1/κ: a dense top with a tail, like a Shampoo factor plus a ridge, whose
    Frobenius norm is about √n/2 times its λmax (for the geometric kind the
    ratio is only about √(n / (2 ln κ))).

    Examples
    --------
    >>> from matroot.bench.problems import spectrum
    >>> spectrum(4, 100.0).round(3).tolist()
    [1.0, 0.215, 0.046, 0.01]
    """
    if kind not in SPECTRA:
        raise ValueError(f"spectrum kind {kind!r} is not one of {SPECTRA}")
    if n == 1:
        return np.ones(1)
    if kind == "geometric":
        return np.geomspace(1.0, 1.0 / kappa, n)
    tail = max(1, n // 8)
    top = np.linspace(1.0, 0.5, n - tail, endpoint=False)
    return np.concatenate([top, np.geomspace(0.5, 1.0 / kappa, tail)])


def spd_stack(n: int, batch: int, kappa: float, *, seed: int = 0,
              dtype=np.float32, kind: str = "geometric") -> np.ndarray:
    """A ``(batch, n, n)`` stack of random SPD matrices with condition number ``kappa``.

    Each matrix is ``Q diag(λ) Qᵀ`` with a Haar-random orthogonal ``Q`` and the
    eigenvalues of :func:`spectrum` (``kind``) times a scale ``s`` drawn
    log-uniformly from [0.1, 10] per matrix (so the solvers' λmax estimate has
    work to do). Built in float64, then rounded to ``dtype``.

    Examples
    --------
    >>> from matroot.bench.problems import spd_stack
    >>> import numpy as np
    >>> a = spd_stack(16, 2, 1e3, seed=1, dtype=np.float64)
    >>> w = np.linalg.eigvalsh(a)
    >>> np.allclose(w[:, -1] / w[:, 0], 1e3)
    True
    """
    if n < 1 or batch < 1:
        raise ValueError(f"n and batch must be >= 1, got n={n}, batch={batch}")
    if not kappa >= 1:
        raise ValueError(f"kappa must be >= 1, got {kappa}")
    rng = np.random.default_rng(seed)
    out = np.empty((batch, n, n))
    lam = spectrum(n, kappa, kind)
    for i in range(batch):
        q, r = np.linalg.qr(rng.standard_normal((n, n)))
        q *= np.sign(np.diag(r))  # Haar measure: fix the signs QR leaves arbitrary.
        scale = 10.0 ** rng.uniform(-1, 1)
        out[i] = (q * (scale * lam)) @ q.T
    out = (out + np.swapaxes(out, -1, -2)) / 2
    return out.astype(dtype)


@dataclass
class Oracle:
    """Float64 eigendecomposition of the stack exactly as the solvers receive it.

    The input is the (float32-rounded) stack, promoted to float64, so the oracle
    answers the rounded problem; at κ = 1e6 rounding alone moves the smallest
    eigenvalues by several percent, so an oracle of the unrounded matrices would
    charge that to the solvers.
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray

    @classmethod
    def of(cls, a: np.ndarray, eps: float = 0.0) -> Oracle:
        wide = np.asarray(a, dtype=np.float64)
        wide = (wide + np.swapaxes(wide, -1, -2)) / 2
        lam, q = np.linalg.eigh(wide)
        return cls(lam + eps, q)

    def inv_root(self, p: float) -> np.ndarray:
        """``(A + eps·I)^(-1/p)`` in float64 for every matrix."""
        lam = self.eigenvalues
        if np.any(lam <= 0):
            raise ValueError("the oracle's stack is not positive definite")
        return (self.eigenvectors * lam[:, None, :] ** (-1.0 / p)) @ np.swapaxes(
            self.eigenvectors, -1, -2)

    @property
    def kappa(self) -> np.ndarray:
        return self.eigenvalues[:, -1] / self.eigenvalues[:, 0]


def relative_errors(roots, exact: np.ndarray) -> np.ndarray:
    """Per-matrix ``‖X − X*‖_F / ‖X*‖_F`` in float64 (NaN results give NaN).

    ``roots`` is a ``(b, n, n)`` host array or a sequence of ``(n, n)`` ones.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.bench.problems import relative_errors
    >>> exact = np.stack([np.eye(2), 2 * np.eye(2)])
    >>> relative_errors(exact * 1.01, exact).round(6).tolist()
    [0.01, 0.01]
    """
    out = np.empty(exact.shape[0])
    for i, x in enumerate(roots):
        diff = np.asarray(x, dtype=np.float64) - exact[i]
        # Sums rather than np.linalg.norm: no BLAS call, so no BLAS thread pool
        # wakes up and spins against the backend being timed next.
        out[i] = np.sqrt(np.sum(diff * diff) / np.sum(exact[i] * exact[i]))
    return out
