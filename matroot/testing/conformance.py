"""``check_inv_root_solver``: grade any inverse-root solver against the accuracy table
and the identities every ``(A + eps·I)^(-1/p)`` satisfies, with shrunk counterexamples.

Examples
--------
A fixed ten-step Newton–Schulz scaled by the Frobenius norm (DASH's default schedule)
is fine for well-conditioned matrices only:

>>> import numpy as np
>>> from matroot.testing import check_inv_root_solver
>>> def newton_schulz_10(a, p, eps):
...     n = a.shape[-1]
...     a = a + eps * np.eye(n, dtype=a.dtype)
...     s = np.linalg.norm(a, axis=(-2, -1))[..., None, None]
...     y, z = a / s, np.broadcast_to(np.eye(n, dtype=a.dtype), a.shape)
...     for _ in range(10):
...         e = 1.5 * np.eye(n, dtype=a.dtype) - 0.5 * (z @ y)
...         y, z = y @ e, e @ z
...     return z / np.sqrt(s)
>>> check_inv_root_solver(newton_schulz_10, p=2, kappa=(1.0, 1e4), max_examples=20,
...                       skip=("nan_isolation", "extreme_scale"))
Traceback (most recent call last):
...
AssertionError: newton_schulz_10 fails the 'accuracy' property: inverse root, p=2: ...
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from .._xp import array_namespace, device_of
from .oracle import SPDCase, host_float64, random_orthogonal, relative_error
from .spectra import FAMILIES
from .strategies import safe_exponent_range, spd_stacks
from .tolerances import (
    accuracy_tolerance,
    dtype_name,
    assert_inv_root_close,
    assert_per_matrix,
    case_tolerances,
)

__all__ = ["PROPERTIES", "check_inv_root_solver"]

#: The properties checked, in the order they run; the first one failing is reported.
PROPERTIES: tuple[str, ...] = ("namespace", "symmetric", "accuracy", "extreme_scale",
                               "scale_covariance", "orthogonal_equivariance",
                               "batch_independence", "nan_isolation")

#: κ cap for the properties comparing two solves of differently rounded inputs.
_RELATIONAL_KAPPA = 1e4
#: Largest power-of-two spread between batch neighbours (2^±20 ≈ 1e±6).
_NEIGHBOUR_EXPONENT = 20


def assert_like_input(result, given) -> None:
    """AssertionError unless ``result`` has the namespace, device, dtype and shape of the
    solver's input ``given``."""
    got = (type(result).__module__, tuple(result.shape), str(result.dtype))
    want = (type(given).__module__, tuple(given.shape), str(given.dtype))
    assert got == want, f"result (module, shape, dtype) {got} != input's {want}"
    assert array_namespace(result) is array_namespace(given), "result in another namespace"
    assert device_of(result) == device_of(given), (
        f"result on device {device_of(result)}, input on {device_of(given)}")


@dataclass(frozen=True)
class _Grader:
    solver: Callable
    method: str
    rtol: float | None

    def tolerances(self, case: SPDCase, p) -> np.ndarray:
        return case_tolerances(case, p, self.method, self.rtol)

    def namespace(self, case, p, data):
        before = host_float64(case.a)
        root = self.solver(case.a, p, case.eps)
        # The same values read twice: bitwise equality is what "left alone" means.
        assert np.array_equal(host_float64(case.a), before, equal_nan=True), (
            "the solver changed its input a in place (or returned a view it then wrote "
            "to); work on a copy")
        assert_like_input(root, case.a)

    def symmetric(self, case, p, data):
        case = _fitted(case, p)
        root = host_float64(self.solver(case.a, p, case.eps))
        # A non-finite or zero root is the accuracy property's finding, reported there.
        graded = np.isfinite(root).all(axis=(-2, -1)) & np.any(root != 0, axis=(-2, -1))
        with np.errstate(invalid="ignore"):
            asymmetry = np.where(graded, relative_error(np.swapaxes(root, -1, -2), root), 0.0)
        assert_per_matrix(asymmetry, self.tolerances(case, p), case, "‖X − Xᵀ‖/‖X‖")

    def accuracy(self, case, p, data):
        case = _fitted(case, p)
        assert_inv_root_close(self.solver(case.a, p, case.eps), case, p, rtol=self.rtol,
                              method=self.method)

    extreme_scale = accuracy

    def scale_covariance(self, case, p, data):
        case = _fitted(case, p)
        k = data.draw(st.integers(*_scale_exponents(case, p)), label="c = 2**k, k")
        c = 2.0 ** k
        base = host_float64(self.solver(case.a, p, case.eps))
        scaled = self.solver(case.a * c, p, case.eps * c)
        errors = relative_error(scaled, c ** (-1.0 / p) * base)
        assert_per_matrix(errors, 2 * self.tolerances(case, p), case,
                          f"f(c·A) vs c^(-1/p)·f(A) with c = 2**{k}, p={p:g}")

    def orthogonal_equivariance(self, case, p, data):
        case = _fitted(case, p)
        q = random_orthogonal(np.random.default_rng(data.draw(st.integers(0, 2**32 - 1),
                                                              label="seed of Q")), (), case.n)
        rotated = q @ host_float64(case.a) @ q.T
        turned = self.solver(case.asarray((rotated + np.swapaxes(rotated, -1, -2)) / 2), p,
                            case.eps)
        expected = q @ host_float64(self.solver(case.a, p, case.eps)) @ q.T
        # Rounding Q·A·Qᵀ to the dtype moves the exact answer by up to about κ·u·√n/p.
        rounding = case.kappa * np.finfo(case.dtype).eps * np.sqrt(case.n) / p
        assert_per_matrix(relative_error(turned, expected),
                          2 * self.tolerances(case, p) + rounding, case,
                          f"f(Q·A·Qᵀ) vs Q·f(A)·Qᵀ, p={p:g}")

    def batch_independence(self, case, p, data):
        # Neighbours of very different scales expose solvers that share one scaling.
        case = _fitted(case, p)
        exponents = np.array(data.draw(st.lists(
            st.integers(*_scale_exponents(case, p, _NEIGHBOUR_EXPONENT)), min_size=3,
            max_size=3),
            label="neighbour scales 2**k"))
        values = host_float64(case.a) * np.exp2(exponents)[:, None, None]
        stack = case.asarray(values)
        together = host_float64(self.solver(stack, p, 0.0))
        alone = np.stack([host_float64(self.solver(stack[i:i + 1, ...], p, 0.0))[0]
                          for i in range(3)])
        assert_per_matrix(relative_error(together, alone), self.tolerances(case, p), case,
                          f"one matrix solved in a batch vs alone, p={p:g}")

    def nan_isolation(self, case, p, data):
        case = _fitted(case, p)
        bad = data.draw(st.integers(0, 2), label="NaN matrix")
        values = host_float64(case.a)
        values[bad] = np.nan
        clean = host_float64(self.solver(case.a, p, case.eps))
        poisoned = host_float64(self.solver(case.asarray(values), p, case.eps))
        errors = relative_error(poisoned, clean)
        errors[bad] = 0.0
        assert_per_matrix(errors, self.tolerances(case, p), case,
                          f"neighbours of a NaN matrix (index {bad}) vs a clean batch, p={p:g}")


def _exponent_window(dtype: str, p: float) -> tuple[float, float]:
    """Exponents (base 2) of eigenvalues of A + eps·I that keep both A and A^(-1/p)
    well inside ``dtype``: for p < 1 the root spreads A's exponents by 1/p."""
    low, high = safe_exponent_range(dtype, 1.0)
    return max(low, -high * p), min(high, -low * p)


def _exponent_span(case: SPDCase) -> tuple[float, float]:
    """log2 of the smallest and largest eigenvalue of ``case.a + eps·I`` over the stack."""
    return (float(np.log2((case.lam[..., 0] + case.eps).min())),
            float(np.log2(case.lam[..., -1].max() + case.eps)))


def _scale_exponents(case: SPDCase, p: float, limit: float = np.inf) -> tuple[int, int]:
    """The k (|k| <= limit, 0 always among them) for which ``2**k · case`` and its root
    ``p`` stay in range."""
    low, high = _exponent_window(case.dtype, p)
    bottom, top = _exponent_span(case)
    return (int(min(0, max(-limit, np.ceil(low - bottom)))),
            int(max(0, min(limit, np.floor(high - top)))))


def _fitted(case: SPDCase, p: float) -> SPDCase:
    """``case``, or ``case`` times the power of two nearest to it whose root ``p`` stays
    in range: only p < 1 ever moves a drawn case."""
    low, high = _exponent_window(case.dtype, p)
    bottom, top = _exponent_span(case)
    # One unit of slack: the strategies put λ at 2**low or 2**high up to rounding.
    if bottom >= low - 1 and top <= high + 1:
        return case
    if top - bottom > high - low:
        shift = np.floor((low + high - top - bottom) / 2)
    else:
        shift = np.floor(high - top) if top > high else np.ceil(low - bottom)
    c = 2.0 ** shift
    return SPDCase(case.asarray(host_float64(case.a) * c), case.eps * c, case.family)


def _strategy(prop: str, *, n, kappa, dtype, xp, device):
    low, high = kappa
    common = {"n": n, "dtype": dtype, "xp": xp, "device": device}
    ordinary = tuple(f for f in FAMILIES if f != "scale_extremes")
    if prop == "extreme_scale":
        return spd_stacks(kappa=kappa, families=("scale_extremes",), **common)
    if prop in ("scale_covariance", "orthogonal_equivariance"):
        return spd_stacks(kappa=(low, min(high, max(low, _RELATIONAL_KAPPA))),
                          families=ordinary, **common)
    if prop in ("batch_independence", "nan_isolation"):
        return spd_stacks(kappa=kappa, families=ordinary, batch_shape=(3,),
                          eps=0.0 if prop == "batch_independence" else None, **common)
    return spd_stacks(kappa=kappa, families=ordinary, **common)


def _search(assert_property: Callable, strategy, ps: tuple,
            search_settings: settings) -> Callable[[], None]:
    """The hypothesis test of one property: ``assert_property(case, p, data)`` on drawn cases."""

    @search_settings
    @given(case=strategy, p=st.sampled_from(ps), data=st.data())
    def property_holds(case, p, data):
        try:
            assert_property(case, p, data)
        except Exception as err:
            raise _PropertyFailed(err) from err

    return property_holds


class _PropertyFailed(Exception):
    """What a property (the solver, or the comparison) raised, told apart from errors in
    drawing the cases (a namespace without float64, an unknown device), which are the
    caller's and not the solver's."""


def examples_per_property(max_examples: int | None) -> int:
    """The hypothesis examples each property gets: ``max_examples``, or the loaded
    profile's when None; anything but a whole number ≥ 1 is refused (0 would check
    nothing, and ``or`` would quietly turn it into the profile's 100)."""
    if max_examples is None:
        return settings().max_examples
    if isinstance(max_examples, bool) or not isinstance(max_examples, (int, np.integer)) \
            or max_examples < 1:
        raise ValueError(f"max_examples={max_examples!r}: give a whole number >= 1 "
                         "(or None for the hypothesis profile's)")
    return int(max_examples)


def require_callable(solver) -> None:
    """Raise a TypeError naming the fix when ``solver`` is not a function (a method's
    name, say): every property would blame the solver for it."""
    if not callable(solver):
        raise TypeError(f"solver must be a function, got {type(solver).__name__} "
                        f"{solver!r}; to grade a matroot method pass e.g. "
                        "lambda a, p, eps: matroot.inv_root(a, p, eps=eps, method='evd')")


def check_inv_root_solver(solver: Callable, *, p: float | Sequence[float] = (1, 2, 4),
                          dtype: str = "float32", xp=None, device=None,
                          n: int | tuple[int, int] = (1, 16),
                          kappa: tuple[float, float] = (1.0, 1e6), method: str = "iterative",
                          rtol: float | None = None, max_examples: int | None = None,
                          skip: Collection[str] = ("nan_isolation",)) -> None:
    """Property-test ``solver(a, p, eps) -> (a + eps·I)^(-1/p)``; raise on the first failure.

    Each property runs as its own hypothesis search over :func:`spd_stacks` cases, in
    the order of :data:`PROPERTIES`:

    - ``namespace``: the result has the input's namespace, device, dtype and shape,
      and the input is left unchanged;
    - ``symmetric``: ``‖X − Xᵀ‖_F ≤ tol·‖X‖_F`` for every finite result;
    - ``accuracy``: within the accuracy table (:func:`accuracy_tolerance`) of the
      float64 oracle, every family at moderate scale;
    - ``extreme_scale``: the same with λmax or λmin near the dtype's range;
    - ``scale_covariance``: ``f(c·A, c·eps) = c^(-1/p)·f(A, eps)`` for powers of two c
      across the dtype's range (to 2·tol);
    - ``orthogonal_equivariance``: ``f(Q·A·Qᵀ) = Q·f(A)·Qᵀ`` (to 2·tol plus what
      rounding Q·A·Qᵀ costs);
    - ``batch_independence``: a matrix solved next to neighbours scaled by up to 2^±20
      gives what it gives alone (to tol);
    - ``nan_isolation``: a NaN matrix leaves its neighbours' results as they were
      (to tol); skipped by default, since not every solver promises it.

    Parameters
    ----------
    solver : callable
        ``solver(a, p, eps)`` with ``a`` a ``(*batch, n, n)`` array of namespace ``xp``.
    p : float or sequence of float
        The roots to try, finite and > 0 (for p < 1 each case is scaled by a power of
        two so that its root stays in the dtype's range as well).
    dtype : {"float32", "float64"}
        Dtype of the inputs; picks the accuracy table's column.
    xp : namespace, optional
        Array namespace of the inputs (numpy by default); ``device`` goes with it.
    n : int or (int, int)
        Matrix sizes (the default reaches past 8, where blocked and recursive
        kernels take over from the small-size code paths).
    kappa : (float, float)
        Range of κ(A + eps·I) (the relational properties stop at 1e4).
    method : str
        Row of the accuracy table ("evd", "iterative", "chebyshev") or a registered
        matroot method, which names its row.
    rtol : float, optional
        One relative tolerance for every κ instead of the table.
    max_examples : int, optional
        Examples per property; by default the loaded hypothesis profile's.
    skip : collection of str
        Properties not to check (names from :data:`PROPERTIES`).

    Raises
    ------
    AssertionError
        Naming the solver, the property and hypothesis's shrunk counterexample.
    ValueError
        For an unknown property name in ``skip``, a p that is not > 0 or is too small
        for the dtype's range at the top of ``kappa``, a ``max_examples`` that is
        not a whole number ≥ 1 (or bad strategy arguments).
    TypeError
        For a ``solver`` that is not callable.
    """
    require_callable(solver)
    unknown = sorted(set(skip) - set(PROPERTIES))
    if unknown:
        raise ValueError(f"unknown properties {unknown} in skip; choose from {PROPERTIES}")
    ps: tuple[float, ...] = (p,) if np.ndim(p) == 0 else tuple(p)  # type: ignore[assignment,arg-type]
    if not ps or not all(0 < q < np.inf for q in ps):
        raise ValueError(f"p={p!r}: give one or more finite roots > 0")
    low, high = _exponent_window(dtype_name(dtype), min(ps))
    if np.log2(kappa[1]) > high - low:
        raise ValueError(f"p={min(ps):g} with κ up to {kappa[1]:g} has roots beyond the range "
                         f"of {dtype_name(dtype)}: raise p or lower kappa's top")
    if rtol is None and accuracy_tolerance(dtype, kappa[1], min(ps), method=method) is None:
        raise ValueError(f"kappa={kappa!r} reaches beyond the accuracy table for {method!r} "
                         f"in {dtype}: lower the range's top or pass rtol=")
    grader = _Grader(solver, method, rtol)
    search_settings = settings(
        max_examples=examples_per_property(max_examples), deadline=None,
        report_multiple_bugs=False,
        phases=[phase for phase in settings().phases if phase != Phase.explain],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    name = getattr(solver, "__name__", repr(solver))
    for prop in PROPERTIES:
        if prop in skip:
            continue
        strategy = _strategy(prop, n=n, kappa=tuple(kappa), dtype=dtype, xp=xp, device=device)
        try:
            _search(getattr(grader, prop), strategy, ps, search_settings)()
        except _PropertyFailed as failure:
            err = failure.args[0]
            raised = "" if isinstance(err, AssertionError) else f"{type(err).__name__}: "
            notes = "\n".join(getattr(failure, "__notes__", ()))
            raise AssertionError(f"{name} fails the {prop!r} property: {raised}{err}\n"
                                 f"{notes}") from err
