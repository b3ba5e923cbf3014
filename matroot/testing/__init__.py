"""Test tools for anyone who writes an inverse-root solver: hard SPD stacks with a known
answer, the README's accuracy table, and a conformance check that shrinks failures.
The benchmarks draw their stacks here too (:func:`scaled_spd_stack`,
:func:`shampoo_factors`: rebuilt from a seed).

The oracles, the seeded stacks and the table need only NumPy; :func:`spd_stacks` and
:func:`check_inv_root_solver` need hypothesis (``pip install "matroot[testing]"``) and
import it only when first used, so ``import matroot`` never does.

Examples
--------
>>> import numpy as np
>>> from matroot.testing import check_inv_root_solver
>>> def eigh_solver(a, p, eps):
...     lam, q = np.linalg.eigh(a + eps * np.eye(a.shape[-1]))
...     return (q * lam[..., None, :] ** (-1.0 / p)) @ np.swapaxes(q, -1, -2)
>>> check_inv_root_solver(eigh_solver, dtype="float64", max_examples=5)
"""

from __future__ import annotations

from typing import Any

from .oracle import (
    SPDCase,
    host_float64,
    oracle_inv_root,
    random_orthogonal,
    relative_error,
    spd_stack,
)
from .seeded import scaled_spd_stack, shampoo_factors
from .polar_oracle import PolarCase, oracle_polar, polar_case, polar_relative_error
from .spectra import ADVERSARIAL_FAMILIES, FAMILIES
from .tolerances import ACCURACY_TABLE, KAPPA_BUCKETS, accuracy_tolerance, assert_inv_root_close

__all__ = [
    "ACCURACY_TABLE",
    "FAMILIES",
    "ADVERSARIAL_FAMILIES",
    "KAPPA_BUCKETS",
    "PROPERTIES",
    "PolarCase",
    "check_polar_solver",
    "oracle_polar",
    "polar_case",
    "polar_relative_error",
    "rectangular_stacks",
    "scaled_spd_stack",
    "shampoo_factors",
    "SPDCase",
    "accuracy_tolerance",
    "assert_inv_root_close",
    "check_inv_root_solver",
    "check_eigenbasis_refresh",
    "EigenbasisCase",
    "eigenbasis_cases",
    "eigenbasis_errors",
    "host_float64",
    "inv_root_options",
    "oracle_inv_root",
    "random_orthogonal",
    "relative_error",
    "spd_stack",
    "spd_stacks",
]

#: Names that need hypothesis, and the module that defines each.
_NEEDS_HYPOTHESIS = {"spd_stacks": "strategies", "inv_root_options": "strategies",
                     "check_inv_root_solver": "conformance",
                     "PROPERTIES": "conformance", "rectangular_stacks": "polar",
                     "check_polar_solver": "polar", "eigenbasis_cases": "eigenbasis",
                     "eigenbasis_errors": "eigenbasis", "EigenbasisCase": "eigenbasis",
                     "check_eigenbasis_refresh": "eigenbasis"}


def __getattr__(name: str) -> Any:
    if name not in _NEEDS_HYPOTHESIS:
        raise AttributeError(f"module 'matroot.testing' has no attribute {name!r}")
    try:
        import hypothesis  # noqa: F401
    except ImportError as err:
        raise ImportError(f"matroot.testing.{name} needs hypothesis: "
                          'pip install "matroot[testing]"') from err
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{_NEEDS_HYPOTHESIS[name]}"), name)
