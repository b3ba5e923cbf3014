"""The solver registry: one :class:`SolverSpec` per method, and the lookups that read it.

Every fact about a method that code outside its own file needs (which root
orders it takes, its default ``tol`` and ``max_iter``, whether it needs a lower
bound on the spectrum, what it costs) is a field of its spec. Validation,
defaults, ``method="auto"``, ``matroot info``, the docs' tables and the
benchmark all read the registry, so adding a solver is its own file plus one
:func:`register_solver` call (the built-in ones are registered in
:mod:`matroot.solvers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple
from collections.abc import Callable, Mapping

from ..certify.accuracy import row_target

__all__ = ["RootOrders", "ANY_REAL_P", "INTEGER_P", "POWER_OF_TWO_P", "SolverSpec",
           "register_solver", "get_solver", "solver_names", "solvers_supporting",
           "unregister_solver", "SOLVERS", "check_method", "require_support",
           "require_dtypes", "accuracy_target"]


class RootOrders(NamedTuple):
    """The root orders p a solver accepts: a test and the words for it."""

    description: str
    accepts: Callable[[int | float], bool]


def _any_real(p: int | float) -> bool:
    return True


def _integer(p: int | float) -> bool:
    return isinstance(p, int)


def _power_of_two(p: int | float) -> bool:
    return isinstance(p, int) and p & (p - 1) == 0


#: Any real ``p > 0`` (p arrives validated: positive and finite, integral values as int).
ANY_REAL_P = RootOrders("any real p > 0", _any_real)
#: Positive integers.
INTEGER_P = RootOrders("any integer p ≥ 1", _integer)
#: 1 and the powers of two, taken as repeated square roots.
POWER_OF_TWO_P = RootOrders("powers of two (1, 2, 4, 8, ...)", _power_of_two)


@dataclass(frozen=True, eq=False)
class SolverSpec:
    """Everything matroot needs to know about one solver, stated once.

    Compared and hashed by identity: a resolved call (:class:`matroot.roots.call.RootCall`)
    that names it is a compile key.

    Attributes
    ----------
    name : str
        The ``method=`` name.
    solve : callable
        ``solve(a, p, *, tol, max_iter, check_every, matmul, scaling[, lower])``
        on a scaled ``(b, n, n)`` stack with spectrum in (0, 1], returning a
        :class:`~matroot.solvers.SolverOutput`; extra keywords are ignored.
    summary : str
        One line on what the method is good for (``matroot info``, the docs).
    root_orders : RootOrders
        The p it accepts.
    default_tol : mapping of str to float
        Default ``tol`` per compute dtype, chosen so the default call meets the
        README's accuracy table (checked in ``tests/accuracy/test_accuracy_table.py``); its
        keys are the compute dtypes the solver accepts.
    default_max_iter : int
        Default iteration cap (the degree cap for a polynomial fit).
    cost : callable
        ``cost(p, kappa) -> float``: the n×n matmuls per matrix estimated for a
        float32 solve at the default ``tol`` of a stack with condition number
        ``kappa``. ``method="auto"`` ranks the matmul-only solvers by it.
    cost_summary : str
        The cost model in words, for the docs.
    needs_lower_bound : bool
        Whether ``solve`` takes ``lower``, a per-matrix lower bound on the
        scaled spectrum (``eps/scale`` or an estimate).
    lower_from_spectrum : bool
        Whether ``lower`` is estimated from the spectrum (never below the ridge)
        even when a ridge gives a bound: for a method whose cost grows with the
        interval (a polynomial fit), a ridge far below the spectrum is wasted work.
    iterative : bool
        Whether ``tol=0`` means "exactly ``max_iter`` steps, never converged";
        false for a direct method, whose ``converged`` holds for any ``tol``.
    matmul_dtypes : tuple
        ``matmul_dtype`` values accepted (None: the compute dtype).
    forms_matmuls : bool
        False for a method whose work is not matmuls (``matmul_dtype`` then
        changes nothing), so it is no candidate for the matmul-only choice.
    needs_scaling : bool
        False for a solver that takes the regularised stack at any scale (no λmax
        estimate is formed) and returns its exact ``lambda_max``.
    accuracy_row : str
        The row of the README's accuracy table the method is held to ("evd",
        "iterative" or "chebyshev"; :data:`matroot.testing.ACCURACY_TABLE`).
    fixed_steps : bool
        Whether the method has a fixed-step rule (:mod:`matroot.solvers.fixed_steps`):
        with a target ``rtol`` (and no ``tol`` or ``max_iter``) it then runs the
        number of steps its scalar error map needs for the largest κ the target
        can be certified at, with no stop test.
    rtol_stop_fraction : float
        For an accuracy target ``rtol`` and no ``tol``, an iterative method stops
        at ``tol = rtol·rtol_stop_fraction`` (a direct method takes ``rtol`` as
        its ``tol``). Its residual is normalised by √n while the error can sit in
        a few directions: measured error/residual at the stop up to 6.4 (p = 1,
        float32, n = 96, isolated top eigenvalue), hence 1/8 by default; the
        certificate then judges the root against ``rtol``.
    """

    name: str
    solve: Callable
    summary: str
    root_orders: RootOrders
    default_tol: Mapping[str, float]
    default_max_iter: int
    cost: Callable[[int | float, float], float]
    cost_summary: str
    needs_lower_bound: bool = False
    lower_from_spectrum: bool = False
    iterative: bool = True
    matmul_dtypes: tuple = (None, "float16", "bfloat16")
    forms_matmuls: bool = True
    needs_scaling: bool = True
    accuracy_row: str = "iterative"
    rtol_stop_fraction: float = 0.125
    fixed_steps: bool = False
    compute_dtypes: tuple = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "default_tol", MappingProxyType(dict(self.default_tol)))
        object.__setattr__(self, "compute_dtypes", tuple(self.default_tol))


_REGISTRY: dict[str, SolverSpec] = {}
#: Read-only view of the registry: method name → :class:`SolverSpec`, in registration order.
SOLVERS: Mapping[str, SolverSpec] = MappingProxyType(_REGISTRY)


def register_solver(spec: SolverSpec, *, replace: bool = False) -> SolverSpec:
    """Add a solver; from then on every method list, check and table includes it.

    Parameters
    ----------
    spec : SolverSpec
        The solver's description.
    replace : bool
        Allow replacing a solver of the same name (otherwise a ValueError).

    Returns
    -------
    SolverSpec
        ``spec``, so a module can write ``SPEC = register_solver(SolverSpec(...))``.

    Examples
    --------
    >>> from matroot.solvers.registry import SOLVERS, register_solver
    >>> register_solver(SOLVERS["evd"])
    Traceback (most recent call last):
    ...
    ValueError: a solver named 'evd' is already registered (pass replace=True to replace it)
    """
    if not isinstance(spec, SolverSpec):
        raise TypeError(f"register_solver takes a SolverSpec, got {type(spec).__name__}")
    if spec.name == "auto" or not spec.name.isidentifier():
        raise ValueError(f"{spec.name!r} cannot name a solver (use an identifier, not 'auto')")
    unknown = set(spec.compute_dtypes) - {"float32", "float64"}
    if not spec.compute_dtypes or unknown:
        raise ValueError(f"solver {spec.name!r}: default_tol needs keys among 'float32' and "
                         f"'float64' (the compute dtypes), got {list(spec.compute_dtypes)}")
    if isinstance(spec.default_max_iter, bool) or not isinstance(spec.default_max_iter, int) \
            or spec.default_max_iter < 1:
        raise ValueError(f"solver {spec.name!r}: default_max_iter must be a positive integer, "
                         f"got {spec.default_max_iter!r}")
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"a solver named {spec.name!r} is already registered "
                         "(pass replace=True to replace it)")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_solver(name: str) -> None:
    """Remove a solver (for tests that register a toy one)."""
    del _REGISTRY[name]


def solver_names() -> tuple[str, ...]:
    """The registered method names, in registration order."""
    return tuple(_REGISTRY)


def check_method(value, name: str = "method") -> str:
    """``value`` if it is ``"auto"`` or a registered method, else a ValueError listing them."""
    if not isinstance(value, str) or (value != "auto" and value not in _REGISTRY):
        raise ValueError(f"{name}={value!r} is not one of "
                         + ", ".join(repr(m) for m in ("auto", *_REGISTRY)))
    return value


def get_solver(name: str) -> SolverSpec:
    """The spec of a registered method (not ``"auto"``)."""
    check_method(name)
    if name == "auto":
        raise ValueError("'auto' is resolved by matroot.choose_method, it has no spec")
    return _REGISTRY[name]


def solvers_supporting(p: int | float) -> tuple[str, ...]:
    """The method names that accept root order ``p`` (positive; integral values as int).

    Examples
    --------
    >>> from matroot.solvers.registry import solvers_supporting
    >>> solvers_supporting(0.5)
    ('evd',)
    """
    return tuple(name for name, spec in _REGISTRY.items() if spec.root_orders.accepts(p))


def require_support(method: str, p: int | float) -> None:
    """A ValueError naming the methods that do accept ``p`` unless ``method`` does."""
    if method != "auto" and not get_solver(method).root_orders.accepts(p):
        raise ValueError(f"method={method!r} does not support p={p:.6g}; methods that do: "
                         + ", ".join(repr(m) for m in solvers_supporting(p)))



def require_dtypes(spec: SolverSpec, compute_dtype: str, matmul_dtype: str | None) -> None:
    """A ValueError unless ``spec`` computes in ``compute_dtype`` with ``matmul_dtype``."""
    for value, accepted, what in ((compute_dtype, spec.compute_dtypes, "compute_dtype"),
                                  (matmul_dtype, spec.matmul_dtypes, "matmul_dtype")):
        if value not in accepted:
            raise ValueError(f"method={spec.name!r} does not take {what}={value!r}; "
                             "it takes " + ", ".join(repr(v) for v in accepted))

def accuracy_target(method: str, precision: str, p, kappa):
    """The error ``converged=True`` promises for each matrix of ``method``, from its κ
    estimate: :func:`matroot.certify.accuracy.row_target` of the row its registry entry names.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.solvers.registry import accuracy_target
    >>> accuracy_target("minimax", "float32", 2, np.array([10.0, 1e3, 1e5, 1e9])).tolist()
    [0.0001, 0.001, 0.02, 0.02]
    """
    return row_target(get_solver(method).accuracy_row, precision, p, kappa)
