"""Hypothesis strategies for SPD stacks that carry their float64 oracle.

Examples
--------
>>> from hypothesis import given, settings
>>> from matroot.testing import spd_stacks
>>> @settings(max_examples=5, deadline=None)
... @given(spd_stacks(n=(2, 6), kappa=(10.0, 1e4), families=["gram", "hilbert"]))
... def test_kappa_in_range(case):
...     assert 10.0 <= case.kappa.min() and case.kappa.max() <= 1e4
>>> test_kappa_in_range()
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from .oracle import SPDCase
from .spectra import FAMILIES, family_stack
from .tolerances import dtype_name

__all__ = ["available_namespaces", "inv_root_options", "safe_exponent_range", "spd_stacks"]

#: Exponent (base 2) of λmax for the ordinary families.
_ORDINARY_SCALE = (-10, 10)
#: Keep the eigenvalues within this power of the dtype's extremes (0.8: a margin
#: for the n-fold sums a matmul makes, without which no solver could stay finite).
_RANGE_FRACTION = 0.8
_DEFAULT_BATCH_SHAPES = ((), (1,), (3,), (2, 2))


def available_namespaces() -> dict[str, Any]:
    """The array namespaces installed here: numpy, array_api_strict, torch, jax."""
    found = {}
    for name, module in (("numpy", "numpy"), ("array_api_strict", "array_api_strict"),
                         ("torch", "torch"), ("jax", "jax.numpy")):
        try:
            found[name] = importlib.import_module(module)
        except ImportError:
            continue
    return found


def safe_exponent_range(dtype: str, kappa: float) -> tuple[int, int]:
    """Exponents k for which λmax = 2**k keeps λmax and λmax/κ well inside ``dtype``."""
    info = np.finfo(dtype)
    low = np.log2(float(info.smallest_normal)) * _RANGE_FRACTION + np.log2(kappa)
    high = np.log2(float(info.max)) * _RANGE_FRACTION
    return int(np.ceil(low)), int(np.floor(high))


def _as_range(value, name: str) -> tuple[float, float]:
    low, high = (value, value) if np.isscalar(value) else tuple(value)
    if not low <= high:
        raise ValueError(f"{name}={value!r} is not a (low, high) range with low <= high")
    return low, high


def _check_dtype(dtype) -> str:
    name = dtype_name(dtype)
    if name not in ("float32", "float64"):
        raise ValueError(f"dtype {dtype!r} is not supported; use 'float32' or 'float64'")
    return name


def _check_batch(shape) -> tuple[int, ...]:
    # An empty stack has no κ to draw nor an oracle to compare with.
    if 0 in tuple(shape):
        raise ValueError(f"batch_shape {tuple(shape)} holds no matrices; test empty "
                         "batches with a plain test of your own")
    if any(d < 0 for d in tuple(shape)):
        raise ValueError(f"batch_shape {tuple(shape)} has a negative dimension")
    return tuple(shape)


@st.composite
def _cases(draw, *, sizes, batch_shapes, kappa_range, log_kappa, families, dtypes, xp,
           device, eps):
    family = draw(st.sampled_from(families))
    n = draw(st.sampled_from([1, 2] if kappa_range[0] == 1.0 else [2]) if family == "small"
             else sizes)
    batch = _check_batch(draw(batch_shapes))
    dtype = draw(st.sampled_from(dtypes))
    kappa = 10.0 ** draw(st.floats(*log_kappa)) if n > 1 else 1.0
    low, high = safe_exponent_range(dtype, kappa)
    if family == "scale_extremes":
        exponent = draw(st.sampled_from([high, low]))
    else:
        exponent = draw(st.integers(max(low, _ORDINARY_SCALE[0]), min(high, _ORDINARY_SCALE[1])))
    scale = 2.0 ** exponent
    if eps is None:
        ridge = 1.0 if family == "gram" else draw(st.sampled_from([0.0, 0.5, 1.0]))
    else:
        ridge = float(eps)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    regularised = scale * family_stack(family, rng, batch, n, kappa)
    ridge_abs = ridge * scale / kappa
    values = regularised - ridge_abs * np.eye(n)
    moved = xp.asarray(values.astype(dtype), **({} if device is None else {"device": device}))
    if not str(moved.dtype).endswith(dtype):
        raise ValueError(f"{xp.__name__} turned {dtype} into {moved.dtype}"
                         + (": enable jax_enable_x64 for float64" if "jax" in xp.__name__
                            else ""))
    case = SPDCase(moved, eps=ridge_abs, family=family)
    # Rounding to float32 can push a nearly singular matrix past zero (no oracle then),
    # or its κ out of the range asked for.
    assume(bool(np.all(case.lam[..., 0] + ridge_abs > 0)))
    if kappa_range[0] < kappa_range[1]:
        assume(bool(np.all((case.kappa >= kappa_range[0]) & (case.kappa <= kappa_range[1]))))
    return case


def spd_stacks(*, n: int | tuple[int, int] | st.SearchStrategy[int] = (1, 8),
               batch_shape: tuple[int, ...] | st.SearchStrategy | None = None,
               kappa: float | tuple[float, float] = (1.0, 1e4),
               families: Sequence[str] | None = None,
               dtype: str | Sequence[str] = "float64", xp=None, device=None,
               eps: float | None = None) -> st.SearchStrategy[SPDCase]:
    """A hypothesis strategy of :class:`SPDCase`: an SPD stack and its float64 oracle.

    Parameters
    ----------
    n : int, (int, int) or strategy of int
        Matrix size, an inclusive range, or a strategy (``st.sampled_from([8, 32, 96])``).
        n = 1 is drawn from a range only when κ = 1 is allowed; the "small" family
        draws n ∈ {1, 2} whatever this says.
    batch_shape : tuple or strategy of tuples, optional
        Leading batch shape; by default one of (), (1,), (3,), (2, 2).
    kappa : float or (float, float)
        Condition number of ``a + eps·I`` (each matrix), or a range drawn log-uniformly.
        Exact up to float64 rounding for float64 stacks; a float32 stack's κ is that of
        its rounded values, which may differ a little at large κ.
    families : sequence of str, optional
        Spectrum families to draw from (:data:`matroot.testing.FAMILIES`), default all:
        geometric, uniform, clustered, isolated_top, tiny_one, repeated (exactly
        repeated eigenvalues), flat_bulk (ones over one or two small eigenvalues),
        scale_extremes (λmax or λmin near the dtype's range),
        small (1×1 and 2×2), gram (Shampoo-like EMA of low-rank Gram matrices plus the
        ridge), hilbert, lehmer, kms, tridiagonal (shifted to the drawn κ).
    dtype : str or sequence of str
        "float32" and/or "float64".
    xp : namespace, optional
        numpy (default), array_api_strict, torch, jax.numpy, ... (jax needs
        ``jax_enable_x64`` for float64).
    device : optional
        Device for the arrays, passed to ``xp.asarray``.
    eps : float, optional
        The ridge as a fraction of λmin(a + eps·I): 0 for none, 1 for a singular ``a``.
        By default drawn from {0, 0.5, 1} (always 1 for "gram": the ridge makes it SPD).

    Returns
    -------
    SearchStrategy[SPDCase]
        Shrinking goes towards the first family (geometric), small n, the first batch
        shape, κ = the range's low end, λmax = 1 and no ridge.

    Raises
    ------
    ValueError
        For an unknown family, an unsupported dtype or an empty range.
    """
    kappa_low, kappa_high = _as_range(kappa, "kappa")
    if not 1.0 <= kappa_low <= kappa_high < np.inf:
        raise ValueError(f"kappa={kappa!r}: a condition number is at least 1 and finite")
    if isinstance(n, st.SearchStrategy):
        sizes = n
    else:
        n_low, n_high = (int(v) for v in _as_range(n, "n"))
        if n_low < 1 or (kappa_low > 1.0 and n_high < 2):
            raise ValueError(f"n={n!r} cannot hold κ >= {kappa_low:g}: use n >= 2")
        # A 1×1 matrix has κ = 1: drawn only when the range allows it.
        sizes = st.integers(n_low if kappa_low == 1.0 else max(n_low, 2), n_high)
    families = tuple(FAMILIES if families is None else
                     ([families] if isinstance(families, str) else families))
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        raise ValueError(f"unknown spectrum families {unknown}; choose from {FAMILIES}")
    if eps is not None and not 0.0 <= eps <= 1.0:
        raise ValueError(f"eps={eps!r} is a fraction of λmin(a + eps·I): give 0 to 1")
    if xp is not None and not hasattr(xp, "asarray"):
        raise TypeError(f"xp={xp!r} is not an array namespace: pass the module (torch, "
                        "numpy, array_api_strict, jax.numpy), not its name")
    several = isinstance(dtype, Sequence) and not isinstance(dtype, str)
    dtypes = tuple(_check_dtype(d) for d in (dtype if several else [dtype]))
    if isinstance(batch_shape, tuple):
        batch_shape = st.just(_check_batch(batch_shape))
    # Keep a float64 κ strictly inside the range despite rounding in the construction.
    margin = 1e-9 if kappa_high > kappa_low else 0.0
    log_kappa = (np.log10(kappa_low) + margin, max(np.log10(kappa_high) - margin,
                                                   np.log10(kappa_low) + margin))
    return _cases(sizes=sizes, kappa_range=(kappa_low, kappa_high),
                  log_kappa=(float(log_kappa[0]), float(log_kappa[1])),
                  batch_shapes=(st.sampled_from(_DEFAULT_BATCH_SHAPES) if batch_shape is None
                                else batch_shape),
                  families=families, dtypes=dtypes, xp=np if xp is None else xp,
                  device=device, eps=eps)


#: The loosest ``tol`` and ``rtol`` :func:`inv_root_options` draws: loose options
#: certified roots that were O(1) off (issue 36).
LOOSEST = 0.5


@st.composite
def _options(draw, methods, ps, loose):
    method = draw(st.sampled_from(methods))
    spec = importlib.import_module("matroot.solvers.registry").get_solver(method)
    p = draw(st.sampled_from([q for q in ps if spec.root_orders.accepts(q)] or [2]))
    options: dict[str, Any] = {"method": method, "p": p}
    kind = draw(st.sampled_from(("default", "tol", "rtol", "both") if loose else ("default",)))
    if kind in ("tol", "both"):
        options["tol"] = 10.0 ** draw(st.floats(-4.0, np.log10(LOOSEST)))
    if kind in ("rtol", "both"):
        options["rtol"] = 10.0 ** draw(st.floats(-4.0, np.log10(LOOSEST)))
    return options


def inv_root_options(*, methods: Sequence[str] | None = None,
                     p: Sequence[int] = (1, 2, 3, 4, 8),
                     loose: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    """A hypothesis strategy of :func:`matroot.inv_root_info` options: ``method``,
    ``p`` and, with ``loose``, a ``tol`` and/or an ``rtol`` drawn log-uniformly in
    ``[1e-4, 0.5]`` (the loosest options a user passes, where a certificate that holds
    at the defaults can still fail).

    Parameters
    ----------
    methods : sequence of str, optional
        Registered root methods to draw from; default every one.
    p : sequence of int
        Root orders; each method draws from those it supports.
    loose : bool
        Also draw ``tol`` / ``rtol``; False draws the defaults only.

    Returns
    -------
    SearchStrategy[dict]
        ``{"method", "p"[, "tol"][, "rtol"]}``; pass ``p`` positionally. What
        ``converged=True`` then promises is
        :func:`matroot.testing.tolerances.promised_tolerance`.

    Examples
    --------
    >>> from hypothesis import given, settings
    >>> from matroot.testing import inv_root_options
    >>> @settings(max_examples=5, deadline=None)
    ... @given(inv_root_options(methods=["newton_db"], p=[2]))
    ... def test_options(options):
    ...     assert options["method"] == "newton_db" and options.get("rtol", 0.5) <= 0.5
    >>> test_options()
    """
    registry = importlib.import_module("matroot.solvers.registry")
    names = tuple(registry.SOLVERS) if methods is None else tuple(methods)
    unknown = sorted(set(names) - set(registry.SOLVERS))
    if unknown or not names:
        raise ValueError(f"unknown methods {unknown}; choose from {sorted(registry.SOLVERS)}")
    return _options(names, tuple(p), loose)
