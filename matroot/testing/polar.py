"""Hypothesis strategies for rectangular stacks and a conformance check for polar solvers.

Examples
--------
>>> import numpy as np
>>> from matroot.testing.polar import check_polar_solver
>>> def svd_polar(g):
...     u, _, vt = np.linalg.svd(g, full_matrices=False)
...     return u @ vt
>>> check_polar_solver(svd_polar, dtype="float64", max_examples=5)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .._xp import from_numpy
from .conformance import assert_like_input, examples_per_property, require_callable
from .oracle import host_float64
from .polar_oracle import PolarCase, polar_case, polar_error_bound, polar_relative_error
from .spectra import random_orthogonal

__all__ = ["rectangular_stacks", "check_polar_solver", "POLAR_PROPERTIES"]

#: The properties :func:`check_polar_solver` checks, in order.
POLAR_PROPERTIES = ("accuracy", "orthogonal_equivariance", "scale_invariance", "transpose",
                    "batch_independence")


@st.composite
def rectangular_stacks(draw, *, m=(1, 12), n=(1, 12), kappa=(1.0, 1e4),
                       batch_shapes=((), (1,), (3,), (2, 2))) -> PolarCase:
    """Float64 :class:`~matroot.testing.polar_oracle.PolarCase` stacks: tall, wide
    and square, singular values log-spaced over ``κ`` times a power-of-two scale.

    Examples
    --------
    >>> from hypothesis import given, settings
    >>> from matroot.testing.polar import rectangular_stacks
    >>> @settings(max_examples=5, deadline=None)
    ... @given(rectangular_stacks(m=(2, 4), n=(2, 4)))
    ... def test_shape(case):
    ...     assert case.g.shape == case.polar.shape
    >>> test_shape()
    """
    rows = draw(st.integers(*m))
    cols = draw(st.integers(*n))
    log_kappa = draw(st.floats(np.log10(kappa[0]), np.log10(kappa[1])))
    batch = draw(st.sampled_from(batch_shapes))
    scale = 2.0 ** draw(st.integers(-20, 20))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return polar_case(np.random.default_rng(seed), tuple(batch), rows, cols,
                      10.0 ** log_kappa, scale=scale)


class _Grader:
    """One method per property: ``grader.<property>(case)`` raises AssertionError on a miss."""

    def __init__(self, solver, dtype, xp, rtol, method):
        self.solver, self.dtype, self.xp, self.rtol = solver, dtype, xp, rtol
        self.method = method

    def run(self, g: np.ndarray) -> np.ndarray:
        given = from_numpy(self.xp, g, dtype=getattr(self.xp, self.dtype))
        factor = self.solver(given)
        assert_like_input(factor, given)
        return host_float64(factor)

    def tolerance(self, kappa: float) -> float:
        return polar_error_bound(self.dtype, kappa, self.rtol, self.method)

    def within(self, error, case: PolarCase, factor: float, what: str):
        bound = factor * self.tolerance(case.kappa)
        assert np.all(error <= bound), \
            f"{what}: relative error {np.max(error):.2e} > {bound:.2e} at κ={case.kappa:.3g}"

    def accuracy(self, case: PolarCase):
        self.within(polar_relative_error(self.run(case.g), case.polar), case, 1.0,
                    "vs the exact polar factor")

    def orthogonal_equivariance(self, case: PolarCase):
        rotation = random_orthogonal(np.random.default_rng(0), (), case.g.shape[-2])
        error = polar_relative_error(self.run(rotation @ case.g), rotation @ self.run(case.g))
        self.within(error, case, 2.0, "polar(QG) vs Q·polar(G)")

    def scale_invariance(self, case: PolarCase):
        error = polar_relative_error(self.run(case.g * 2.0 ** 17), self.run(case.g))
        self.within(error, case, 2.0, "polar(cG) vs polar(G)")

    def transpose(self, case: PolarCase):
        flipped = np.swapaxes(self.run(np.swapaxes(case.g, -1, -2)), -1, -2)
        self.within(polar_relative_error(flipped, self.run(case.g)), case, 2.0,
                    "polar(Gᵀ)ᵀ vs polar(G)")

    def batch_independence(self, case: PolarCase):
        g = case.g.reshape(-1, *case.g.shape[-2:])
        neighbours = np.concatenate([g * 2.0 ** 20, g, g[::-1] * 2.0 ** -20])
        together = self.run(neighbours)[len(g):2 * len(g)]
        self.within(polar_relative_error(together, self.run(g)), case, 2.0,
                    "in a batch vs alone")


def check_polar_solver(solver: Callable, *, dtype: str = "float32", xp=None,
                       m: tuple[int, int] = (1, 10), n: tuple[int, int] = (1, 10),
                       kappa: tuple[float, float] = (1.0, 1e3), rtol: float | None = None,
                       method: str = "polar_express", max_examples: int | None = None) -> None:
    """Property-test ``solver(g) -> polar factor``; raise on the first failure.

    Properties (:data:`POLAR_PROPERTIES`), each its own hypothesis search over
    :func:`rectangular_stacks`: ``accuracy`` against the exact polar factor within
    :func:`~matroot.certify.polar_accuracy.polar_error_bound`; ``polar(QG) = Q·polar(G)``;
    ``polar(cG) = polar(G)`` for ``c = 2¹⁷``; ``polar(Gᵀ) = polar(G)ᵀ``; a matrix in a
    batch next to neighbours scaled by ``2^±20`` gives what it gives alone
    (the relational ones to twice the bound).

    Parameters
    ----------
    solver : callable
        ``solver(g)`` for a ``(*batch, m, n)`` array of namespace ``xp``.
    dtype : {"float32", "float64"}
        The inputs' dtype, and the precision row of the bound.
    xp : namespace, optional
        Array namespace of the inputs (numpy by default; array-api-compat's
        wrapper for torch, e.g. ``array_api_compat.torch``).
    m, n : (int, int)
        Ranges of the matrix sizes.
    kappa : (float, float)
        Range of ``σmax/σmin``.
    rtol : float, optional
        The ``rtol`` the solver runs at (the precision's default when None).
    method : str
        The matroot method whose bound applies (its error factor, if any).
    max_examples : int, optional
        Examples per property; the loaded hypothesis profile's by default.

    Raises
    ------
    AssertionError
        Naming the property and hypothesis's shrunk counterexample.
    ValueError
        For a ``max_examples`` that is not a whole number ≥ 1, or a ``kappa`` that is
        not a range of finite condition numbers ≥ 1.
    TypeError
        For a ``solver`` that is not callable.
    """
    require_callable(solver)
    if not 1.0 <= kappa[0] <= kappa[1] < np.inf:
        raise ValueError(f"kappa={kappa!r} is not a (low, high) range of finite condition "
                         "numbers >= 1")
    grader = _Grader(solver, dtype, np if xp is None else xp, rtol, method)
    search_settings = settings(
        max_examples=examples_per_property(max_examples), deadline=None,
        report_multiple_bugs=False, suppress_health_check=[HealthCheck.too_slow])
    strategy = rectangular_stacks(m=m, n=n, kappa=kappa)
    for prop in POLAR_PROPERTIES:
        assert_property = getattr(grader, prop)
        try:
            search_settings(given(strategy)(assert_property))()
        except AssertionError as err:
            name = getattr(solver, "__name__", repr(solver))
            raise AssertionError(f"{name} fails the {prop!r} property: {err}") from err
