"""matroot: batched matrix inverse p-th roots for any array-API backend.

``matroot.inv_root(a, p)`` computes ``(A + eps·I)^(-1/p)`` for every symmetric
positive (semi)definite matrix of a stack ``a[..., n, n]`` of NumPy, CuPy or
PyTorch arrays, with any solver of the registry (:mod:`matroot.solvers.registry`):
eigh, Newton–Schulz, coupled Newton, minimax polynomial iterations or Chebyshev.
"""

from .eigenbasis import EigenbasisResult, refresh_eigenbasis
from .polar_factor.api import PolarResult, polar, polar_info
from .roots.api import (
    ConvergenceWarning,
    InvRootResult,
    default_max_iter,
    default_tol,
    inv_root,
    inv_root_info,
)
from .spectrum.scaling import (
    SpectralBounds,
    lambda_max_bound,
    lambda_min_estimate,
    power_iteration,
    spectral_bounds,
)
from .solvers.auto import choose_method

__version__ = "0.1.0"

__all__ = [
    "inv_root",
    "inv_root_info",
    "polar",
    "polar_info",
    "PolarResult",
    "refresh_eigenbasis",
    "EigenbasisResult",
    "InvRootResult",
    "ConvergenceWarning",
    "default_tol",
    "default_max_iter",
    "choose_method",
    "power_iteration",
    "lambda_max_bound",
    "lambda_min_estimate",
    "spectral_bounds",
    "SpectralBounds",
]
