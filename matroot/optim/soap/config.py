"""SOAP's hyperparameters: one frozen, validated :class:`SOAPConfig`.

Every default is stated here once; the torch shell (:class:`matroot.optim.SOAP`), the
optax shell (:func:`matroot.optim.optax.soap`) and the functional core
(:func:`matroot.optim.soap.init` / :func:`~matroot.optim.soap.update`) read them from
this class.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass, fields

from ...eigenbasis import DEFAULT_ITERATIONS, DEFAULT_RTOL
from ...eigenbasis.refresh import METHODS
from ..shampoo_core.blocking import DEFAULT_MAX_FACTOR_RATIO, FactorPolicy, check_block_size
from ..shampoo_core.config import (NONFINITE_POLICIES, WEIGHT_DECAY_TYPES, ShampooConfig,
                                   check_keywords)
from ..shampoo_core.option_groups import GRAFTING, check_one_of, check_positive_int, check_real

__all__ = ["SOAPConfig", "PER_PARAMETER", "GRAFTINGS", "check_soap_keywords"]

#: SOAP's ``grafting`` choices: none (its own step sizes), or the norm of Shampoo's
#: grafting directions.
GRAFTINGS = ("none",) + GRAFTING

#: Fields that may differ between parameters sharing factor stacks: read per parameter.
PER_PARAMETER = ("lr", "weight_decay")

#: Other SOAP implementations' keywords and what to use here.
_RENAMED = {
    "max_preconditioner_dim": "Distributed Shampoo's max_preconditioner_dim is block_size",
    "max_precond_dim": "use max_preconditioned_dim",
    "epsilon": "use eps",
    "use_bias_correction": "use bias_correction",
    "correct_bias": "use bias_correction",
    "preconditioner_config": "SOAP is the preconditioner: leave it out (eigenbasis_* set "
                             "the eigenvector refresh)",
    "grafting_config": "use grafting='adam' for Adam{Grafting,Preconditioner}Config(beta2, "
                       "epsilon) with grafting_beta2=beta2, grafting_eps=epsilon; 'rmsprop' "
                       "and 'adagrad' for RMSprop/AdaGrad's likewise, 'sgd' for SGD's; "
                       "None is grafting='none', the default",
    "merge_dims": "tensors are merged to matrices as Shampoo merges them: leave it out",
}


@dataclass(frozen=True)
class SOAPConfig:
    """Hyperparameters of SOAP (Shampoo's eigenbasis, Adam inside it).

    Parameters
    ----------
    lr : float
        Learning rate.
    betas : (float, float)
        ``β₁`` of the first moment, ``β₂`` of the second moment (both kept in the
        eigenbasis); ``β₂ = 1`` sums the squares (AdaGrad's second moment, no bias
        correction for it), as Distributed Shampoo's default ``betas=(0.9, 1.0)`` does.
    shampoo_beta : float, optional
        EMA factor of the Kronecker factors L, R (1 = running sums). Default ``β₂``.
    eps : float
        Added to ``√v̂``.
    weight_decay : float
    weight_decay_type : {"decoupled", "l2"}
        "decoupled" (AdamW's): ``−lr·weight_decay·param`` added to the update; "l2":
        ``weight_decay·param`` added to the gradient first.
    bias_correction : bool
        Divide the moments by ``1−β₁ᵗ`` and ``1−β₂ᵗ``.
    maximize : bool
        Maximize the objective (the gradients are negated first).
    block_size : int or math.inf
        Largest block side (Distributed Shampoo's ``max_preconditioner_dim``).
    max_preconditioned_dim : int or float
        A dimension longer than this gets no factor: an identity basis on that side
        (a one-sided block; SOAP's ``max_precond_dim``).
    max_factor_ratio : float
        A dimension cut into blocks gets no factor when its factors would hold more
        than this many numbers per element (:class:`~matroot.optim.FactorPolicy`).
    precondition_1d : bool
        Rotate vectors by the eigenbasis of their one factor; False (SOAP's default)
        gives vectors and scalars plain Adam.
    precondition_frequency : int
        Steps between eigenbasis refreshes.
    start_preconditioning_step : int
        The first refresh (1-based); before it the basis is the identity (Adam).
    grafting : {"none", "adam", "rmsprop", "adagrad", "sgd"}
        "none": SOAP's own step. Otherwise each block's direction (each parameter's,
        for a parameter without factors) is rescaled to the Frobenius norm of that
        block's grafting direction, and before ``start_preconditioning_step`` the
        grafting direction is the step (Distributed Shampoo's ``grafting_config``):
        "sgd" the bias-corrected first moment ``m̂`` (no extra state); "adam"
        ``m̂/(√v̂ + grafting_eps)`` from moments of its own, "rmsprop" the same
        without bias correction of ``v``, "adagrad" with ``v`` a running sum (each
        keeps one parameter-sized pair of moments more).
    grafting_beta2 : float, optional
        ``β₂`` of the grafting second moment ("adam", "rmsprop"). Default ``β₂``.
    grafting_eps : float, optional
        Added to the grafting ``√v̂``. Default ``eps``.
    eigenbasis_iterations, eigenbasis_rtol, eigenbasis_method
        ``iterations``, ``rtol`` and ``method`` of :func:`matroot.refresh_eigenbasis`
        (its defaults); a basis it does not certify comes from eigh.
    nonfinite_grads : {"raise", "skip"}
        What a step with NaN/Inf gradients does, as in :class:`~matroot.optim.ShampooConfig`.
    stacked : bool
        Blocks of one shape share stacks (False: one stack per block, for comparisons).

    Examples
    --------
    >>> SOAPConfig().factor_beta
    0.95
    >>> SOAPConfig(precondition_frequency=5).refreshes_at(6), SOAPConfig().refreshes_at(1)
    (True, True)
    """

    lr: float = 3e-3
    betas: tuple[float, float] = (0.95, 0.95)
    shampoo_beta: float | None = None
    eps: float = 1e-8
    weight_decay: float = 0.01
    weight_decay_type: str = "decoupled"
    bias_correction: bool = True
    maximize: bool = False
    block_size: float = 1024
    max_preconditioned_dim: float = 10000
    max_factor_ratio: float = DEFAULT_MAX_FACTOR_RATIO
    precondition_1d: bool = False
    precondition_frequency: int = 10
    start_preconditioning_step: int = 1
    grafting: str = "none"
    grafting_beta2: float | None = None
    grafting_eps: float | None = None
    eigenbasis_iterations: int = DEFAULT_ITERATIONS
    eigenbasis_rtol: float = DEFAULT_RTOL
    eigenbasis_method: str = "block"
    nonfinite_grads: str = "raise"
    stacked: bool = True

    def __post_init__(self):
        check_real(self.lr, "lr", 0.0)
        if len(tuple(self.betas)) != 2:
            raise ValueError(f"betas must be a pair (β₁, β₂), got {self.betas!r}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        check_real(self.betas[0], "betas[0]", 0.0, 1.0, high_open=True)
        check_real(self.betas[1], "betas[1]", 0.0, 1.0)
        if self.shampoo_beta is not None:
            check_real(self.shampoo_beta, "shampoo_beta", 0.0, 1.0, low_open=True)
        check_real(self.eps, "eps", 0.0)
        check_real(self.weight_decay, "weight_decay", 0.0)
        check_one_of(self.weight_decay_type, "weight_decay_type", WEIGHT_DECAY_TYPES)
        check_block_size(self.block_size)
        if not (isinstance(self.max_preconditioned_dim, numbers.Real)
                and self.max_preconditioned_dim >= 1):
            raise ValueError(f"max_preconditioned_dim must be a number >= 1 or math.inf, "
                             f"got {self.max_preconditioned_dim!r}")
        check_real(self.max_factor_ratio, "max_factor_ratio", 0.0, low_open=True) \
            if self.max_factor_ratio != math.inf else None
        check_positive_int(self.precondition_frequency, "precondition_frequency")
        check_positive_int(self.start_preconditioning_step, "start_preconditioning_step")
        check_one_of(self.grafting, "grafting", GRAFTINGS)
        if self.grafting_beta2 is not None:
            check_real(self.grafting_beta2, "grafting_beta2", 0.0, 1.0)
        if self.grafting_eps is not None:
            check_real(self.grafting_eps, "grafting_eps", 0.0)
        check_positive_int(self.eigenbasis_iterations, "eigenbasis_iterations")
        check_real(self.eigenbasis_rtol, "eigenbasis_rtol", 0.0, 1.0, low_open=True,
                   high_open=True)
        check_one_of(self.eigenbasis_method, "eigenbasis_method", METHODS)
        check_one_of(self.nonfinite_grads, "nonfinite_grads", NONFINITE_POLICIES)

    @property
    def factor_beta(self) -> float:
        """The EMA factor of L and R: ``shampoo_beta``, else ``β₂``."""
        return self.betas[1] if self.shampoo_beta is None else float(self.shampoo_beta)

    @property
    def factor_policy(self) -> FactorPolicy:
        """Which dimensions get a factor (and so an eigenbasis)."""
        return FactorPolicy(precondition_1d=self.precondition_1d,
                            max_preconditioned_dim=self.max_preconditioned_dim,
                            max_factor_ratio=self.max_factor_ratio)

    def refreshes_at(self, step):
        """Whether the eigenbases are refreshed at (1-based) ``step``: at
        ``start_preconditioning_step`` and every ``precondition_frequency`` steps after
        (a bool for an int, a boolean array for a 0-d integer array)."""
        since = step - self.start_preconditioning_step
        due = (since >= 0) & (since % self.precondition_frequency == 0)
        return bool(due) if isinstance(step, numbers.Integral) else due

    @functools.cached_property
    def adam(self) -> ShampooConfig:
        """The Shampoo config whose elementwise half (:mod:`~matroot.optim.shampoo_core.grafting`:
        effective gradients, Adam moments, final updates) SOAP runs, in the eigenbasis."""
        return ShampooConfig(lr=self.lr, betas=self.betas, eps=self.eps,
                             weight_decay=self.weight_decay,
                             weight_decay_type=self.weight_decay_type,
                             bias_correction=self.bias_correction, maximize=self.maximize,
                             grafting="adam", nonfinite_grads=self.nonfinite_grads)

    @functools.cached_property
    def grafting_method(self) -> ShampooConfig | None:
        """The Shampoo config whose grafting direction
        (:func:`~matroot.optim.shampoo_core.grafting.grafting_directions`) sets each
        block's step length; None for ``grafting="none"``."""
        if self.grafting == "none":
            return None
        eps = self.eps if self.grafting_eps is None else self.grafting_eps
        return dataclasses.replace(self.adam, eps=eps, grafting=self.grafting,
                                   grafting_beta2=self.grafting_beta2)

    @property
    def keeps_grafting_moments(self) -> bool:
        """Whether the grafting direction has moments of its own (all but sgd, none)."""
        return self.grafting not in ("none", "sgd")

    def grafting_started(self, step):
        """Whether (1-based) ``step`` takes SOAP's grafted direction rather than the
        grafting direction itself: from ``start_preconditioning_step`` on (a bool for
        an int, a boolean array for a 0-d integer array)."""
        started = step >= self.start_preconditioning_step
        return bool(started) if isinstance(step, numbers.Integral) else started


def check_soap_keywords(names, where: str = "SOAP", *, metadata: bool = False) -> None:
    """A TypeError naming each of ``names`` that is not a :class:`SOAPConfig` field, with the
    fix (a group's own keys pass with ``metadata``:
    :func:`~matroot.optim.shampoo_core.config.check_keywords`).

    Examples
    --------
    >>> check_soap_keywords(["max_precond_dim"])
    Traceback (most recent call last):
    ...
    TypeError: SOAP has no option 'max_precond_dim' (use max_preconditioned_dim)
    """
    check_keywords(names, where, config=SOAPConfig, renamed=_RENAMED, metadata=metadata)


#: The keyword names, for the shells.
FIELDS = tuple(f.name for f in fields(SOAPConfig) if f.init)
