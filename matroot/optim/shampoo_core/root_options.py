"""The inverse-root keywords an optimizer passes to every solve: one typed, validated value.

``ShampooConfig(root_options=...)`` takes a :class:`RootOptions` or a dict of the
same keywords; either is checked when the config is made, so a misspelt key or a
bad value fails at construction, not at the first refresh many steps later.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..._checks import (
    COMPUTE_DTYPES,
    MATMUL_DTYPES,
    SCALINGS,
    check_choice,
    check_max_iter,
    check_nonnegative,
)

__all__ = ["RootOptions", "ROOT_OPTIONS"]


@dataclass(frozen=True)
class RootOptions:
    """Keywords of :func:`matroot.inv_root_info` for the optimizer's root solves.

    Each left None takes :func:`matroot.inv_root`'s default.

    Parameters
    ----------
    tol : float, optional
        Stopping tolerance (``0`` with ``max_iter=k``: exactly k steps).
    max_iter : int, optional
        Cap on iterations (on the degree for chebyshev).
    scaling : {"power", "frobenius"}, optional
        How the spectrum is scaled into the solver's basin.
    matmul_dtype : {"float16", "bfloat16"}, optional
        16-bit matmul operands with float32 accumulation.
    compute_dtype : {"float32", "float64"}, optional
        dtype of the solve.

    Raises
    ------
    ValueError, TypeError
        A value :func:`matroot.inv_root` would refuse.

    Examples
    --------
    >>> RootOptions(tol=0, max_iter=10).keywords()
    {'tol': 0.0, 'max_iter': 10}
    >>> RootOptions.from_value({"scaling": "trace"})
    Traceback (most recent call last):
    ...
    ValueError: scaling='trace' is not one of 'power', 'frobenius'
    """

    tol: float | None = None
    max_iter: int | None = None
    scaling: str | None = None
    matmul_dtype: str | None = None
    compute_dtype: str | None = None

    def __post_init__(self):
        if self.tol is not None:
            object.__setattr__(self, "tol", check_nonnegative(self.tol, "root_options tol"))
        object.__setattr__(self, "max_iter", check_max_iter(self.max_iter))
        if self.scaling is not None:
            check_choice(self.scaling, "scaling", SCALINGS)
        check_choice(self.matmul_dtype, "matmul_dtype", MATMUL_DTYPES)
        check_choice(self.compute_dtype, "compute_dtype", COMPUTE_DTYPES)

    @classmethod
    def from_value(cls, value: RootOptions | dict | None) -> RootOptions:
        """A :class:`RootOptions` from itself, a dict of its keywords, or None (no options)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"root_options must be a RootOptions or a dict of {ROOT_OPTIONS}, "
                            f"got {type(value).__name__}")
        unknown = sorted(set(value) - set(ROOT_OPTIONS))
        if unknown:
            raise ValueError(f"root_options keys {unknown} are not inv_root options; allowed: "
                             + ", ".join(ROOT_OPTIONS))
        return cls(**value)

    def keywords(self) -> dict[str, Any]:
        """The options that are set, as :func:`matroot.inv_root_info` keywords."""
        return {k: v for k, v in asdict(self).items() if v is not None}


#: The :func:`matroot.inv_root` keywords that ``root_options`` may set.
ROOT_OPTIONS = tuple(f.name for f in fields(RootOptions))
