"""The polar-method registry: one :class:`PolarMethod` per ``method=`` name.

Validation, ``method="auto"``, the docs' table and ``python -m bench polar`` read
it; nothing else lists the polar methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from .coefficients import MUON_POLAR_STEPS, MUON_QUINTIC, MUON_STEPS, polar_schedule
from .decomposition import eigh_polar, svd_polar
from .fitted import FITTED_LOOSENESS, FITTED_LOWER, FITTED_QUINTICS, fitted_steps
from .polynomial import gram_side_steps, odd_quintic_steps

__all__ = ["PolarMethod", "POLAR_METHODS", "get_polar_method", "polar_method_names"]

#: Steps between recomputations of the Gram matrix in ``gram_newton_schulz``.
GRAM_RESTART_EVERY = 3
#: Runs of at most this many steps (Muon's) do not restart: measured (torch CPU,
#: float32 and bfloat16 operands, stacks 8×512..2048×128..256, κ = 1e2 and 1e4) the
#: defect is the same with and without (0.28 and 0.62), and the restart's two
#: m×n×n products are a third of the time at aspect ratio 8.
GRAM_SHORT_RUN = 4


@dataclass(frozen=True)
class PolarMethod:
    """Everything :func:`matroot.polar_info` needs to know about one method.

    Attributes
    ----------
    name : str
        The ``method=`` name.
    summary : str
        One line for the docs and ``python -m bench polar``.
    solve : callable
        ``solve(x, gram, rows, matmul)`` on a ``(b, m, n)`` stack (``n ≤ m``) with
        ``XᵀX = gram``, scaled as ``scaling`` says; returns the polar factor. A
        ``"certified"`` method also takes ``gram_squared=`` (``gram²``, when the
        ``"gram_norm"`` σmax bound formed it).
    scaling : str
        ``"certified"``: divided by a proven upper bound on σmax (so σ ≤ 1; which
        one is the call's ``sigma_bound``);
        ``"frobenius"``: divided by ‖X‖_F, as Muon does; ``"none"``: entries
        normalised only (a decomposition needs no scale).
    steps : callable
        ``steps(lower, target, margin, max_iter)`` → the ``(c1, c3, c5)`` rows of
        the polynomial steps (empty for a decomposition).
    forms_products : bool
        Whether ``matmul_dtype`` applies (the decompositions ignore it).
    muon_steps : int or None
        The steps Muon runs when its ``polar_steps`` is None: the quintic's 5
        (torch.optim.Muon's ``ns_steps``), Polar Express's 4; None for a
        decomposition.
    sigma_bound : str or None
        The σmax bound ``sigma_bound="auto"`` takes for this method (a schedule
        designed for a given looseness); None: the general rule of
        :data:`matroot.polar_factor.api.SIGMA_BOUNDS`.
    """

    name: str
    summary: str
    solve: Callable
    scaling: str
    steps: Callable
    forms_products: bool
    muon_steps: int | None = None
    sigma_bound: str | None = None


def _polar_express_steps(lower, target, margin, max_iter):
    rows = polar_schedule(lower, target, margin).coefficients
    return tuple(tuple(float(c) for c in row)
                 for row in (rows[:max_iter] if max_iter is not None else rows))


def _muon_steps(lower, target, margin, max_iter):
    return (MUON_QUINTIC,) * (MUON_STEPS if max_iter is None else max_iter)


def _no_steps(lower, target, margin, max_iter):
    return ()


def _gram_side(x, gram, rows, matmul, gram_squared=None):
    short = len(rows) <= GRAM_SHORT_RUN
    return gram_side_steps(x, gram, rows, matmul, gram_squared,
                           restart_every=len(rows) + 1 if short else GRAM_RESTART_EVERY)


POLAR_METHODS = MappingProxyType({
    "polar_express": PolarMethod(
        "polar_express",
        "per-step minimax quintics for the certified interval [lower, 1] (Polar Express); "
        "3 products a step, as many steps as lower and rtol need",
        odd_quintic_steps, "certified", _polar_express_steps, True, MUON_POLAR_STEPS),
    "gram_newton_schulz": PolarMethod(
        "gram_newton_schulz",
        "the polar_express quintics iterated on the n×n Gram side with a restart every "
        f"{GRAM_RESTART_EVERY} steps (none in runs of up to {GRAM_SHORT_RUN}, Muon's): "
        "cheaper per step for tall m ≫ n, less accurate",
        _gram_side, "certified", _polar_express_steps, True, MUON_POLAR_STEPS),
    "rms_quintic": PolarMethod(
        "rms_quintic",
        f"{len(FITTED_QUINTICS)} odd quintics fitted to the RMS defect of spectra spread "
        f"over σ/σmax ∈ [{FITTED_LOWER:g}, 1] ({3 * len(FITTED_QUINTICS)} products; positive, "
        f"never a sign flip), for σmax bounds up to {FITTED_LOOSENESS}× loose: 'auto' takes "
        "the Cholesky bound; converged only where rtol is met; a larger max_iter adds "
        "Polar Express steps",
        odd_quintic_steps, "certified", fitted_steps, True, len(FITTED_QUINTICS), "cholesky"),
    "quintic": PolarMethod(
        "quintic",
        "Muon's fixed quintic (3.4445, -4.7750, 2.0315) five times after a Frobenius "
        "normalisation: singular values end in about [0.7, 1.2], never converged",
        odd_quintic_steps, "frobenius", _muon_steps, True, MUON_STEPS),
    "svd": PolarMethod("svd", "U·Vᵀ from a batched SVD: the reference",
                       svd_polar, "none", _no_steps, False),
    "eigh": PolarMethod("eigh", "X·(XᵀX)^(-1/2) from eigh of the Gram matrix (κ squared)",
                        eigh_polar, "none", _no_steps, True),
})


def polar_method_names() -> tuple[str, ...]:
    """The ``method=`` names, ``"auto"`` first."""
    return ("auto", *POLAR_METHODS)


def get_polar_method(name: str) -> PolarMethod:
    """The registry entry of ``name``; ValueError naming the choices otherwise."""
    if name not in POLAR_METHODS:
        raise ValueError(f"method={name!r} is not a polar method; choose one of "
                         + ", ".join(repr(n) for n in polar_method_names()))
    return POLAR_METHODS[name]
