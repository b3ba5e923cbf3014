"""Test tools for eigenbasis refreshes: cases with a previous basis, the float64 grade of
a result, a hypothesis strategy, and ``check_eigenbasis_refresh``.

A case is a factor ``A = β·A₀ + (1 − β)·G·Gᵀ`` (``A₀`` from a spectrum family, ``G`` of
rank r) and a start basis derived from ``A₀``'s eigenvectors: exact, rotated a little,
columns shuffled, columns scaled (not orthonormal), or NaN. A result is graded by
:func:`eigenbasis_errors` against the float64 eigenvalues of the values it was given.

Examples
--------
>>> import numpy as np
>>> from matroot.testing import check_eigenbasis_refresh
>>> def eigh_refresh(a, basis):
...     from matroot.eigenbasis import EigenbasisResult
...     w, q = np.linalg.eigh(a)
...     ones = np.ones(a.shape[:-2], dtype=bool)
...     return EigenbasisResult(q, w, 0 * w[..., 0], ones, 0 * ones, ~ones)
>>> check_eigenbasis_refresh(eigh_refresh, rtol=1e-2, max_examples=5, skip=["nan_isolation"])
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from .oracle import host_float64
from .spectra import FAMILIES, family_stack
from .strategies import safe_exponent_range
from .tolerances import dtype_name

__all__ = ["EIGENBASIS_PROPERTIES", "STARTS", "EigenbasisCase", "eigenbasis_cases",
           "eigenbasis_errors", "check_eigenbasis_refresh"]

#: How a case's start basis is made from the previous factor's eigenvectors.
STARTS = ("exact", "rotated", "shuffled", "scaled", "nan")
#: Properties :func:`check_eigenbasis_refresh` checks, in order.
EIGENBASIS_PROPERTIES = ("namespace", "promise", "nan_isolation")
#: The families a case's previous factor comes from: matroot's spectra plus a zero matrix.
BASIS_FAMILIES = (*FAMILIES, "zero")


@dataclass(frozen=True, repr=False)
class EigenbasisCase:
    """A stack ``a``, a start ``basis`` (both in the test's namespace) and how they were made."""

    a: Any
    basis: Any
    family: str
    beta: float
    start: str

    @property
    def n(self) -> int:
        return int(self.a.shape[-1])

    def __repr__(self) -> str:
        return (f"EigenbasisCase(family={self.family!r}, start={self.start!r}, "
                f"beta={self.beta}, shape={tuple(self.a.shape)}, dtype={self.a.dtype})")


def _eigenvectors_of(a0: np.ndarray) -> np.ndarray:
    return np.linalg.eigh(a0)[1]


def _started(rng, q: np.ndarray, start: str) -> np.ndarray:
    if start == "rotated":
        # A small random rotation: the exponential of a skew matrix of norm ~1e-2.
        k = rng.standard_normal(q.shape) * 1e-2 / np.sqrt(q.shape[-1])
        k = k - np.swapaxes(k, -1, -2)
        w, v = np.linalg.eigh(1j * k)
        u = ((v * np.exp(-1j * w)[..., None, :]) @ np.conj(np.swapaxes(v, -1, -2))).real
        return q @ u
    if start == "shuffled":
        return q[..., rng.permutation(q.shape[-1])]
    if start == "scaled":
        return q * rng.uniform(0.5, 2.0, q.shape[-1])
    if start == "nan":
        return q * np.nan
    return q


def eigenbasis_case(rng: np.random.Generator, *, family: str, n: int, batch: tuple,
                    kappa: float, exponent: int, beta: float, rank: int, start: str,
                    dtype: str, xp, device=None) -> EigenbasisCase:
    """One :class:`EigenbasisCase` from explicit choices (what the strategy draws)."""
    if family == "zero":
        a0 = np.zeros((*batch, n, n))
    else:
        a0 = family_stack(family, rng, batch, n, kappa) * 2.0 ** exponent
    g = rng.standard_normal((*batch, n, rank))
    energy = np.trace(a0, axis1=-2, axis2=-1)[..., None, None] / max(rank, 1)
    a = beta * a0 + (1 - beta) * (g * np.sqrt(energy / n)) @ np.swapaxes(g, -1, -2)
    a = (a + np.swapaxes(a, -1, -2)) / 2
    basis = _started(rng, _eigenvectors_of(a0), start)
    put = {} if device is None else {"device": device}
    return EigenbasisCase(xp.asarray(a.astype(dtype), **put),
                          xp.asarray(basis.astype(dtype), **put), family, beta, start)


@st.composite
def _cases(draw, *, sizes, batch_shapes, families, starts, dtypes, xp, device):
    family = draw(st.sampled_from(families), label="family")
    n = draw(sizes, label="n")
    batch = tuple(draw(batch_shapes, label="batch"))
    dtype = draw(st.sampled_from(dtypes), label="dtype")
    kappa = 10.0 ** draw(st.floats(0, 6), label="log10 κ") if n > 1 else 1.0
    low, high = safe_exponent_range(dtype, kappa * max(n, 1) ** 2)
    exponent = draw(st.sampled_from([0, low, high, max(low, -30), min(high, 30)]),
                    label="scale 2**k")
    beta = draw(st.sampled_from([1.0, 0.999, 0.95, 0.5]), label="beta")
    rank = draw(st.integers(1, max(1, n)), label="rank of G")
    start = draw(st.sampled_from(starts), label="start")
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    return eigenbasis_case(rng, family=family, n=n, batch=batch, kappa=kappa,
                           exponent=exponent, beta=beta, rank=rank, start=start,
                           dtype=dtype, xp=xp, device=device)


def eigenbasis_cases(*, n: int | tuple[int, int] = (1, 12),
                     batch_shape: tuple[int, ...] | None = None,
                     families: Sequence[str] | None = None,
                     starts: Sequence[str] = ("exact", "rotated", "shuffled", "scaled"),
                     dtype: str | Sequence[str] = "float32", xp=None,
                     device=None) -> st.SearchStrategy[EigenbasisCase]:
    """A hypothesis strategy of :class:`EigenbasisCase`: a factor and a start basis.

    Parameters
    ----------
    n : int or (int, int)
        Matrix size or inclusive range.
    batch_shape : tuple, optional
        Leading batch shape; by default one of (), (1,), (3,), (2, 2).
    families : sequence of str, optional
        Families of the previous factor: :data:`matroot.testing.FAMILIES` and "zero"
        (default all).
    starts : sequence of str
        From :data:`STARTS` ("nan" gives a NaN basis, which a refresh must survive).
    dtype : str or sequence of str
        "float32" and/or "float64".
    xp, device : optional
        Namespace (numpy by default) and device of the arrays.

    Returns
    -------
    SearchStrategy[EigenbasisCase]
    """
    low, high = (int(n), int(n)) if isinstance(n, int) else (int(n[0]), int(n[1]))
    if not 1 <= low <= high:
        raise ValueError(f"n={n!r}: give a size >= 1 or a (low, high) range")
    chosen = tuple(BASIS_FAMILIES if families is None else families)
    unknown = sorted(set(chosen) - set(BASIS_FAMILIES)) + sorted(set(starts) - set(STARTS))
    if unknown or not chosen or not starts:
        raise ValueError(f"unknown families or starts {unknown}; choose from "
                         f"{BASIS_FAMILIES} and {STARTS}")
    dtypes = (dtype,) if isinstance(dtype, str) else tuple(dtype)
    dtypes = tuple(dtype_name(d) for d in dtypes)
    shapes = (st.sampled_from([(), (1,), (3,), (2, 2)]) if batch_shape is None
              else st.just(tuple(batch_shape)))
    return _cases(sizes=st.integers(int(low), int(high)), batch_shapes=shapes,
                  families=chosen, starts=tuple(starts), dtypes=dtypes,
                  xp=np if xp is None else xp, device=device)


def eigenbasis_errors(a, eigenvectors, eigenvalues) -> dict[str, np.ndarray]:
    """Float64 grades of a result, per matrix, relative to ``‖A‖_F`` (1 for a zero A):

    - ``reconstruction``: ``‖A − Q·diag(λ)·Qᵀ‖_F``;
    - ``eigenvalues``: the 2-norm of sorted λ minus A's eigenvalues;
    - ``orthogonality``: ``‖QᵀQ − I‖_F`` (not relative).

    Examples
    --------
    >>> import numpy as np
    >>> errors = eigenbasis_errors(np.diag([2.0, 1.0]), np.eye(2), np.array([2.0, 1.0]))
    >>> [float(errors[k]) for k in ("reconstruction", "eigenvalues", "orthogonality")]
    [0.0, 0.0, 0.0]
    """
    a, q, lam = (host_float64(x) for x in (a, eigenvectors, eigenvalues))
    a = (a + np.swapaxes(a, -1, -2)) / 2
    # Divided by a power of two near the largest entry: squares of 1e200 overflow.
    with np.errstate(invalid="ignore", divide="ignore"):
        top = np.max(np.abs(np.where(np.isfinite(a), a, 0.0)), axis=(-2, -1))
        scale = np.exp2(np.floor(np.log2(np.where(top > 0, top, 1.0))))
    a, lam = a / scale[..., None, None], lam / scale[..., None]
    norm = np.linalg.norm(a, axis=(-2, -1))
    norm = np.where(norm > 0, norm, 1.0)
    n = a.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):
        rebuilt = (q * lam[..., None, :]) @ np.swapaxes(q, -1, -2)
        oracle = np.linalg.eigvalsh(np.where(np.isfinite(a), a, 0.0))
        return {
            "reconstruction": np.linalg.norm(a - rebuilt, axis=(-2, -1)) / norm,
            "eigenvalues": np.linalg.norm(np.sort(lam, axis=-1) - oracle, axis=-1) / norm,
            "orthogonality": np.linalg.norm(np.swapaxes(q, -1, -2) @ q - np.eye(n),
                                            axis=(-2, -1)),
        }


def _describe_failure(what: str, errors: np.ndarray, limit, where) -> str:
    worst = np.unravel_index(np.nanargmax(np.where(where, errors, -np.inf)), errors.shape)
    return (f"{what} {errors[worst]:.3g} > {np.broadcast_to(limit, errors.shape)[worst]:.3g} "
            f"for converged matrix {tuple(int(i) for i in worst)}")


@dataclass(frozen=True)
class _Grader:
    refresh: Callable
    rtol: float
    orthogonality: float | None

    def orthogonality_limit(self, case) -> float:
        return self.rtol if self.orthogonality is None else self.orthogonality

    def namespace(self, case):
        before = host_float64(case.a)
        result = self.refresh(case.a, case.basis)
        assert np.array_equal(host_float64(case.a), before, equal_nan=True), (
            "the refresh changed its input a in place")
        batch = tuple(case.a.shape[:-2])
        for name, shape in (("eigenvectors", tuple(case.a.shape)),
                            ("eigenvalues", (*batch, case.n)), ("converged", batch)):
            got = getattr(result, name)
            assert tuple(got.shape) == shape, f"{name} has shape {tuple(got.shape)} != {shape}"
            assert type(got).__module__ == type(case.a).__module__, f"{name} in another library"
        assert str(result.eigenvectors.dtype) == str(case.a.dtype), (
            f"eigenvectors have dtype {result.eigenvectors.dtype}, a has {case.a.dtype}")

    def promise(self, case):
        result = self.refresh(case.a, case.basis)
        converged = np.asarray(host_float64(result.converged), dtype=bool)
        errors = eigenbasis_errors(case.a, result.eigenvectors, result.eigenvalues)
        limits = {"reconstruction": self.rtol, "eigenvalues": self.rtol,
                  "orthogonality": self.orthogonality_limit(case)}
        for what, limit in limits.items():
            bad = converged & ~(errors[what] <= limit)
            assert not bad.any(), _describe_failure(what, errors[what], limit, bad)

    def nan_isolation(self, case):
        if case.a.ndim != 3 or case.a.shape[0] < 2:
            return
        values = host_float64(case.a)
        values[0] = np.nan
        xp_a = _like(case.a, values)
        clean = self.refresh(case.a, case.basis)
        poisoned = self.refresh(xp_a, case.basis)
        assert not bool(np.asarray(host_float64(poisoned.converged))[0]), (
            "a NaN matrix came back converged")
        for name in ("eigenvectors", "eigenvalues", "converged"):
            got, want = (host_float64(getattr(r, name))[1:] for r in (poisoned, clean))
            assert np.array_equal(got, want, equal_nan=True), (
                f"a NaN matrix at index 0 changed its neighbours' {name}")


def _like(reference, values: np.ndarray):
    from .._xp import array_namespace, device_of

    xp = array_namespace(reference)
    return xp.astype(xp.asarray(np.ascontiguousarray(values), device=device_of(reference)),
                     reference.dtype)


def check_eigenbasis_refresh(refresh: Callable, *, rtol: float, dtype: str = "float32",
                             xp=None, device=None, n: int | tuple[int, int] = (1, 12),
                             families: Sequence[str] | None = None,
                             orthogonality: float | None = None,
                             max_examples: int | None = None,
                             skip: Collection[str] = ()) -> None:
    """Property-test ``refresh(a, basis)`` (a result with ``eigenvectors``,
    ``eigenvalues``, ``converged``); raise on the first failure.

    - ``namespace``: results of the input's library and shapes, eigenvectors of a's
      dtype, the input left unchanged;
    - ``promise``: every matrix reported converged has reconstruction and eigenvalue
      errors (:func:`eigenbasis_errors`) at most ``rtol`` and orthogonality at most
      ``orthogonality`` (default ``rtol``);
    - ``nan_isolation``: a NaN matrix is not converged and changes none of its
      neighbours' results (bitwise).

    Parameters
    ----------
    refresh : callable
        ``refresh(a, basis)`` for stacks of namespace ``xp``.
    rtol : float
        The tolerance the refresh was asked for (its promise's).
    dtype, xp, device, n, families
        What the cases are drawn from (:func:`eigenbasis_cases`).
    orthogonality : float, optional
        The bound on ``‖QᵀQ − I‖_F`` for converged matrices.
    max_examples : int, optional
        Examples per property (the hypothesis profile's by default).
    skip : collection of str
        Properties not to check (from :data:`EIGENBASIS_PROPERTIES`).

    Raises
    ------
    AssertionError
        Naming the property and hypothesis's shrunk case.
    ValueError
        For an unknown property in ``skip`` or an rtol outside (0, 1).
    TypeError
        For a ``refresh`` that is not callable.
    """
    if not callable(refresh):
        raise TypeError(f"refresh must be a function, got {type(refresh).__name__}; e.g. "
                        "lambda a, q: matroot.refresh_eigenbasis(a, q, rtol=1e-2)")
    unknown = sorted(set(skip) - set(EIGENBASIS_PROPERTIES))
    if unknown:
        raise ValueError(f"unknown properties {unknown} in skip; choose from "
                         f"{EIGENBASIS_PROPERTIES}")
    if not 0 < rtol < 1:
        raise ValueError(f"rtol={rtol!r} must be in (0, 1)")
    grader = _Grader(refresh, float(rtol), orthogonality)
    search = settings(max_examples=max_examples or settings().max_examples, deadline=None,
                      report_multiple_bugs=False,
                      phases=[p for p in settings().phases if p != Phase.explain],
                      suppress_health_check=[HealthCheck.too_slow])
    name = getattr(refresh, "__name__", repr(refresh))
    for prop in EIGENBASIS_PROPERTIES:
        if prop in skip:
            continue
        strategy = eigenbasis_cases(
            n=n, dtype=dtype, xp=xp, device=device, families=families,
            batch_shape=(3,) if prop == "nan_isolation" else None)

        try:
            search(given(case=strategy)(getattr(grader, prop)))()
        except AssertionError as err:
            raise AssertionError(f"{name} fails the {prop!r} property: {err}") from err
