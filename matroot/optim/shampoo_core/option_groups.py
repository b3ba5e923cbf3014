"""Shampoo's options by concern: grafting, blocking, root solve, storage.

Each group is a frozen dataclass that checks its own fields when it is made, under
the names :class:`~matroot.optim.ShampooConfig` gives them (the flat keywords of
the config, the torch optimizer and the optax shell), so an error names the keyword
to fix. A config builds its groups once, at construction (``config.grafting_options``,
``config.blocking``, ``config.root_solve``, ``config.storage``), and
:meth:`~matroot.optim.ShampooConfig.from_groups` builds a config from groups.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields

from ...solvers.registry import check_method
from .blocking import DEFAULT_MAX_FACTOR_RATIO, FactorPolicy, check_block_size
from .root_options import RootOptions

__all__ = ["GraftingOptions", "BlockingOptions", "RootSolveOptions", "StorageOptions",
           "GRAFTING", "ROOT_STORAGE_DTYPES", "check_real", "check_positive_int",
           "check_one_of", "group_fields"]

#: Elementwise directions whose per-block norm the Shampoo direction takes.
GRAFTING = ("adam", "adagrad", "rmsprop", "sgd")
#: dtypes the inverse roots may be stored in (computed and applied in float32/64).
ROOT_STORAGE_DTYPES = (None, "float32", "bfloat16", "float16")


def check_real(value, name, low=None, high=None, *, low_open=False, high_open=False):
    """``value`` as a float, or a ValueError naming ``name`` and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    value = float(value)
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")
    return value


def check_positive_int(value, name):
    """``value`` as an int, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_one_of(value, name, allowed):
    """A ValueError naming ``name`` and the choices unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of " + ", ".join(map(repr, allowed)))


def group_fields(group_type) -> tuple:
    """The keyword names a group takes (the config's fields of that concern)."""
    return tuple(f.name for f in fields(group_type))


@dataclass(frozen=True)
class GraftingOptions:
    """The elementwise direction each Shampoo block takes the norm of
    (:class:`~matroot.optim.ShampooConfig`'s ``grafting``, ``grafting_beta2``, ``eps``).

    Examples
    --------
    >>> GraftingOptions(grafting="adagrad").second_moment_beta(0.999)
    1.0
    """

    grafting: str = "adam"
    grafting_beta2: float | None = None
    eps: float = 1e-8

    def __post_init__(self):
        check_one_of(self.grafting, "grafting", GRAFTING)
        if self.grafting_beta2 is not None:
            check_real(self.grafting_beta2, "grafting_beta2", 0.0, 1.0)
        check_real(self.eps, "eps", 0.0)

    def second_moment_beta(self, beta2: float) -> float | None:
        """``β₂'`` of the grafting second moment (1: running sum; None: none kept),
        given the factors' ``β₂``."""
        if self.grafting == "sgd":
            return None
        if self.grafting == "adagrad":
            return 1.0
        return beta2 if self.grafting_beta2 is None else float(self.grafting_beta2)


@dataclass(frozen=True)
class BlockingOptions:
    """How parameters are cut into blocks and which dimensions get factors.

    Examples
    --------
    >>> BlockingOptions(block_size=256, skip_dims=[1]).factor_policy.skip_dims
    (1,)
    """

    block_size: int | float = 1024
    max_preconditioned_dim: int | float = math.inf
    max_factor_ratio: float = DEFAULT_MAX_FACTOR_RATIO
    skip_dims: tuple = ()
    precondition: bool = True
    precondition_1d: bool = False
    stacked: bool = True

    def __post_init__(self):
        check_block_size(self.block_size)
        if self.max_preconditioned_dim != math.inf:
            check_positive_int(self.max_preconditioned_dim, "max_preconditioned_dim")
        if self.max_factor_ratio != math.inf:
            object.__setattr__(self, "max_factor_ratio", check_real(
                self.max_factor_ratio, "max_factor_ratio", 0.0, low_open=True))
        skip = tuple(self.skip_dims)
        if not set(skip) <= {0, 1}:
            raise ValueError(f"skip_dims must hold matrix-view dimensions 0 and/or 1, "
                             f"got {self.skip_dims!r}")
        object.__setattr__(self, "skip_dims", skip)

    @property
    def factor_policy(self) -> FactorPolicy:
        """Which dimensions of a parameter get factors."""
        return FactorPolicy(precondition=bool(self.precondition),
                            precondition_1d=bool(self.precondition_1d),
                            max_preconditioned_dim=self.max_preconditioned_dim,
                            max_factor_ratio=self.max_factor_ratio,
                            skip_dims=self.skip_dims)


@dataclass(frozen=True)
class RootSolveOptions:
    """How and when the inverse roots are solved.

    Examples
    --------
    >>> RootSolveOptions(precondition_frequency=5).refreshes_roots_at(10)
    True
    """

    root_method: str = "auto"
    matrix_eps: float = 1e-8
    root_options: RootOptions = field(default_factory=RootOptions)
    precondition_frequency: int = 10
    start_preconditioning_step: int | None = None

    def __post_init__(self):
        check_method(self.root_method, "root_method")
        check_real(self.matrix_eps, "matrix_eps", 0.0)
        object.__setattr__(self, "root_options", RootOptions.from_value(self.root_options))
        check_positive_int(self.precondition_frequency, "precondition_frequency")
        start = self.start_preconditioning_step
        if start is not None and (isinstance(start, bool) or not isinstance(start, numbers.Integral)
                                  or start < 1):
            raise ValueError("start_preconditioning_step must be a positive integer or None, "
                             f"got {start!r}")

    @property
    def first_preconditioned_step(self) -> int:
        """The step at which Shampoo directions (and root refreshes) start."""
        if self.start_preconditioning_step is None:
            return self.precondition_frequency
        return int(self.start_preconditioning_step)

    def refreshes_roots_at(self, step):
        """Whether the inverse roots are recomputed at (1-based) ``step`` (an int, or
        a 0-d integer array giving a boolean array)."""
        start = self.first_preconditioned_step
        if isinstance(step, numbers.Integral):
            return bool(step >= start and (step - start) % self.precondition_frequency == 0)
        return (step >= start) & ((step - start) % self.precondition_frequency == 0)


@dataclass(frozen=True)
class StorageOptions:
    """How factors and roots are kept between steps.

    Examples
    --------
    >>> StorageOptions().keeps_roots(precondition_frequency=1)
    False
    """

    root_storage_dtype: str | None = None
    symmetric_packing: bool = True
    keep_roots: bool | None = None

    def __post_init__(self):
        check_one_of(self.root_storage_dtype, "root_storage_dtype", ROOT_STORAGE_DTYPES)
        if self.keep_roots is not None and not isinstance(self.keep_roots, bool):
            raise ValueError(f"keep_roots must be True, False or None (automatic), "
                             f"got {self.keep_roots!r}")
        if self.keep_roots is False and self.root_storage_dtype is not None:
            raise ValueError("root_storage_dtype sets how kept roots are stored; with "
                             "keep_roots=False no root is stored, so leave it None")

    def keeps_roots(self, precondition_frequency: int) -> bool:
        """``keep_roots``, or for None whether roots live longer than one step
        (refreshed less often than every step, or stored in a dtype of their own)."""
        if self.keep_roots is not None:
            return self.keep_roots
        return precondition_frequency != 1 or self.root_storage_dtype is not None
