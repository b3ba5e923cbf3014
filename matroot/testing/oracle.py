"""Float64 oracles: the exact answer for a stack with a known eigendecomposition.

Nothing here needs hypothesis: :class:`SPDCase` and the helpers serve plain tests too.

Examples
--------
>>> import numpy as np
>>> from matroot.testing import oracle_inv_root, relative_error
>>> a = np.diag([4.0, 16.0])
>>> oracle_inv_root(a, 2)
array([[0.5 , 0.  ],
       [0.  , 0.25]])
>>> float(relative_error(np.diag([0.5, 0.25]), oracle_inv_root(a, 2)))
0.0
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._xp import array_namespace, device_of, to_numpy
from .spectra import random_orthogonal, spectrum

__all__ = [
    "SPDCase",
    "host_float64",
    "oracle_inv_root",
    "random_orthogonal",
    "relative_error",
    "spd_stack",
    "symmetric_from_eigenpairs",
]


def host_float64(x) -> np.ndarray:
    """Any backend's array (or nested lists of numbers) as a float64 NumPy array,
    bfloat16 included."""
    if isinstance(x, (list, tuple, int, float)):
        return np.asarray(x, dtype=np.float64)
    if str(x.dtype).endswith("bfloat16") and not isinstance(x, np.ndarray):
        # Some backends (torch) cannot hand bfloat16 to NumPy; float32 holds it exactly.
        xp = array_namespace(x)
        x = xp.astype(x, xp.float32)
    out = to_numpy(x)
    if str(out.dtype) == "bfloat16":
        out = out.astype(np.float32)
    return out.astype(np.float64)


def _matrices(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` if it is a stack of square matrices; ValueError naming ``name`` otherwise."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name} has shape {x.shape}; expected a (..., n, n) stack of "
                         "square matrices")
    return x


def _power_of_two_scale(a: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Per-matrix power of two at most ``max(max|a|, floor)``: dividing by it is exact
    and avoids overflow (rounded down, so that it stays finite near the largest
    float64)."""
    top = np.maximum(np.max(np.abs(a), axis=(-2, -1), keepdims=True), floor)
    return np.exp2(np.floor(np.log2(np.where(top > 0, top, 1.0))))


def _scaled_eigh(a: np.ndarray, floor: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float64 eigendecomposition of the symmetric part of ``a/scale``, and the
    per-matrix power of two ``scale`` (shape (..., 1)) near ``max(max|a|, floor)``:
    the eigenvalues of ``a`` are ``lam·scale``, which can lie beyond float64's range
    where ``lam`` does not."""
    scale = _power_of_two_scale(a, floor)
    b = a / scale
    lam, q = np.linalg.eigh((b + np.swapaxes(b, -1, -2)) / 2)
    return lam, q, scale[..., 0]


def _eigh(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float64 eigendecomposition of the symmetric part, safe at any scale."""
    lam, q, scale = _scaled_eigh(a)
    return lam * scale, q


def _function_of(lam, q, values) -> np.ndarray:
    return (q * values[..., None, :]) @ np.swapaxes(q, -1, -2)


def oracle_inv_root(a, p: float, eps: float = 0.0, *, refine: bool = False) -> np.ndarray:
    """``(A + eps·I)^(-1/p)`` of the given values (any backend), in float64 via eigh.

    Indefinite or singular matrices give NaN or Inf, as they have no real inverse root.

    A float64 eigh moves λmin by about ``n·u·λmax`` (its backward error), so the root
    it gives is off by about ``n·u·κ/p``: as much as a float64 solver's own error
    past κ ≈ 1e9 (3.5e10, p = 8, n = 3: 1.3e-6 against 40-digit mpmath, above the
    table's 1e-6). ``refine=True`` corrects it to first order: with ``Q`` from eigh,
    ``M = QᵀAQ`` is formed in long double and the root is
    ``Q·(f(diag M) + f[dᵢ, dⱼ]∘offdiag M)·Qᵀ`` (``f[·,·]`` the divided differences of
    ``λ^(-1/p)``), which leaves about ``(u·κ)²`` plus long double's rounding (measured
    against mpmath on that case: 1.3e-6 → 2e-13 where long double has 64 bits;
    where it is float64 the correction is rounding noise and leaves eigh's accuracy).
    """
    if not p > 0:
        raise ValueError(f"p={p!r}: the root's order must be > 0")
    lam, q, scale = _scaled_eigh(_matrices(host_float64(a), "a"), eps)
    if refine:
        b = host_float64(a) / scale[..., None]
        return _refined_root(q, (b + np.swapaxes(b, -1, -2)) / 2, eps / scale, p, scale)
    # Scaled, so that a spectrum beyond float64's range (entries near its largest
    # number) still has a root in range.
    with np.errstate(invalid="ignore", divide="ignore"):
        return _function_of(lam, q, (lam + eps / scale) ** (-1.0 / p) * scale ** (-1.0 / p))


def _refined_root(q, b, shift, p, scale) -> np.ndarray:
    """``(b + shift·I)^(-1/p)·scale^(-1/p)`` from eigh's ``q``, corrected to first order in
    long double (:func:`oracle_inv_root`)."""
    wide = np.longdouble
    qw = q.astype(wide)
    m = np.swapaxes(qw, -1, -2) @ b.astype(wide) @ qw
    d = np.diagonal(m, axis1=-2, axis2=-1) + np.asarray(shift, dtype=wide)  # (..., 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = d ** wide(-1.0 / p)
        di, dj = d[..., :, None], d[..., None, :]
        close = np.abs(di - dj) <= 1e-6 * np.maximum(np.abs(di), np.abs(dj))
        mean = (di + dj) / 2
        slope = np.where(close, wide(-1.0 / p) * mean ** wide(-1.0 / p - 1.0),
                         (f[..., :, None] - f[..., None, :])
                         / np.where(close, wide(1.0), di - dj))
    n = d.shape[-1]
    inner = np.where(np.eye(n, dtype=bool), 0.0, m) * slope
    inner = inner + f[..., :, None] * np.eye(n, dtype=wide)
    root = qw @ inner @ np.swapaxes(qw, -1, -2)
    with np.errstate(over="ignore"):
        return (root * np.asarray(scale, dtype=wide)[..., None] ** wide(-1.0 / p)
                ).astype(np.float64)


def relative_error(x, ref) -> np.ndarray:
    """Per-matrix relative Frobenius error ``‖x − ref‖_F / ‖ref‖_F``, safe at any scale.

    ``x`` and ``ref`` are stacks of the same shape, any backend (``ref`` may also be
    one matrix for the whole stack ``x``); other shapes raise ValueError rather than
    broadcast into a plausible number.
    """
    x, ref = _matrices(host_float64(x), "x"), _matrices(host_float64(ref), "ref")
    if x.shape[-1] != ref.shape[-1] or np.broadcast_shapes(x.shape, ref.shape) != x.shape:
        raise ValueError(f"x has shape {x.shape} but ref has shape {ref.shape}: compare "
                         "stacks of the same shape")
    scale = _power_of_two_scale(ref)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.linalg.norm((x - ref) / scale, axis=(-2, -1))
                / np.linalg.norm(ref / scale, axis=(-2, -1)))


def spd_stack(rng: np.random.Generator, batch: tuple, n: int, kappa: float, *,
              lam_max: float = 1.0, spread: str = "geometric"):
    """Stack ``Q diag(λ) Qᵀ`` with λmax = lam_max and λmax/λmin = kappa, Q random.

    ``spread`` is a spectral family of :mod:`matroot.testing.spectra` ("geometric",
    "uniform", "clustered", ...). Returns ``(a, q, lam)`` in float64.
    """
    if not 0 < lam_max < math.inf:
        raise ValueError(f"lam_max={lam_max!r}: the largest eigenvalue of a positive "
                         "definite stack is finite and > 0")
    batch = tuple(batch)
    lam = lam_max * spectrum(spread, rng, batch, n, kappa)
    q = random_orthogonal(rng, batch, n)
    return symmetric_from_eigenpairs(q, lam), q, lam


def symmetric_from_eigenpairs(q: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """``Q diag(λ) Qᵀ`` for stacks ``q`` (…, n, n) and ``lam`` (…, n), made exactly symmetric.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.testing.oracle import symmetric_from_eigenpairs
    >>> symmetric_from_eigenpairs(np.eye(2), np.array([3.0, 1.0]))
    array([[3., 0.],
           [0., 1.]])
    """
    a = _function_of(lam, q, lam)
    return (a + np.swapaxes(a, -1, -2)) / 2


@dataclass(frozen=True, repr=False)
class SPDCase:
    """A test stack with its float64 eigendecomposition and the ridge to solve it with.

    Attributes
    ----------
    a : array
        The input stack ``(*batch, n, n)`` in the requested namespace, device and dtype.
    eps : float
        The ridge: the solver is asked for ``(a + eps·I)^(-1/p)``.
    family : str
        The spectrum family it was drawn from (:data:`matroot.testing.FAMILIES`).
    lam, q : numpy.ndarray
        Float64 eigenvalues and eigenvectors of the values of ``a`` (after rounding
        to its dtype), so the oracles answer for exactly what the solver is given.
    """

    a: Any
    eps: float
    family: str
    lam: np.ndarray = field(init=False)
    q: np.ndarray = field(init=False)

    def __post_init__(self):
        lam, q = _eigh(host_float64(self.a))
        object.__setattr__(self, "lam", lam)
        object.__setattr__(self, "q", q)

    @property
    def n(self) -> int:
        return int(self.a.shape[-1])

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.a.shape[:-2])

    @property
    def dtype(self) -> str:
        """The dtype's name ("float32", "float64")."""
        return str(self.a.dtype).rsplit(".", 1)[-1]

    @property
    def kappa(self) -> np.ndarray:
        """Per-matrix condition number of ``a + eps·I`` (float64 eigenvalues)."""
        return (self.lam[..., -1] + self.eps) / (self.lam[..., 0] + self.eps)

    def inv_root(self, p: float, eps: float | None = None) -> np.ndarray:
        """Float64 ``(a + eps·I)^(-1/p)`` for any real p > 0 (eps defaults to the case's)."""
        return self._power(-1.0 / p, eps)

    def root(self, p: float, eps: float | None = None) -> np.ndarray:
        """Float64 ``(a + eps·I)^(1/p)`` for any real p > 0 (eps defaults to the case's)."""
        return self._power(1.0 / p, eps)

    def _power(self, exponent: float, eps: float | None) -> np.ndarray:
        shifted = self.lam + (self.eps if eps is None else eps)
        return _function_of(self.lam, self.q, np.maximum(shifted, 0.0) ** exponent)

    def asarray(self, values: np.ndarray):
        """``values`` (float64 NumPy) in this case's namespace, device and dtype."""
        return _like(self.a, values)

    def describe(self, index: tuple[int, ...] | None = None) -> str:
        """One line saying what the case (or one matrix of it) is."""
        kappa = self.kappa if index is None else self.kappa[index]
        where = "" if index is None else f"matrix {index} of batch {self.batch_shape}, "
        return (f"{where}family {self.family!r}, n={self.n}, κ={np.max(kappa):.3g}, "
                f"eps={self.eps:.3g}, {self.dtype}")

    def __repr__(self) -> str:
        shown = host_float64(self.a)
        text = (np.array2string(shown, precision=6, separator=", ", threshold=64)
                if shown.size <= 32 else f"<{self.dtype} array {tuple(self.a.shape)}>")
        return (f"SPDCase(family={self.family!r}, n={self.n}, batch={self.batch_shape}, "
                f"kappa={np.max(self.kappa):.4g}, eps={self.eps!r}, dtype={self.dtype}, "
                f"a={text})")


def _like(reference, values: np.ndarray):
    """Put float64 ``values`` into the namespace, device and dtype of ``reference``."""
    xp = array_namespace(reference)
    moved = xp.asarray(np.ascontiguousarray(values), device=device_of(reference))
    return xp.astype(moved, reference.dtype)
