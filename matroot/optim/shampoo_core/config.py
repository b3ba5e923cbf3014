"""Shampoo's hyperparameters: one frozen, validated :class:`ShampooConfig`.

Every default is stated here once; the torch shell (:class:`matroot.optim.Shampoo`)
and the functional core (:func:`matroot.optim.init` / :func:`~matroot.optim.update`)
read them from this class.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from .option_groups import (
    GRAFTING,
    ROOT_STORAGE_DTYPES,
    BlockingOptions,
    GraftingOptions,
    RootSolveOptions,
    StorageOptions,
    check_one_of,
    check_real,
    group_fields,
)
from .blocking import DEFAULT_MAX_FACTOR_RATIO, FactorPolicy
from .root_options import ROOT_OPTIONS, RootOptions

__all__ = [
    "ShampooConfig",
    "NonFiniteGradientError",
    "ROOT_OPTIONS",
    "NONFINITE_POLICIES",
    "GRAFTING",
    "WEIGHT_DECAY_TYPES",
    "ROOT_STORAGE_DTYPES",
    "PER_PARAMETER",
    "check_keywords",
]

#: What ``update`` does with a NaN or Inf gradient.
NONFINITE_POLICIES = ("raise", "skip")
#: Decoupled (AdamW's) or L2 (added to the gradient, Adam's) weight decay.
WEIGHT_DECAY_TYPES = ("decoupled", "l2")
#: Fields that may differ between parameters sharing factor stacks: read per parameter.
PER_PARAMETER = ("lr", "weight_decay", "precondition", "precondition_1d",
                 "max_preconditioned_dim", "max_factor_ratio", "skip_dims")
#: The option groups a config builds, by attribute name.
GROUPS = {"grafting_options": GraftingOptions, "blocking": BlockingOptions,
          "root_solve": RootSolveOptions, "storage": StorageOptions}


class NonFiniteGradientError(ValueError):
    """A gradient holds NaN or Inf and ``nonfinite_grads="raise"``."""


@dataclass(frozen=True)
class ShampooConfig:
    """Hyperparameters of :func:`init` / :func:`update` and :class:`~matroot.optim.Shampoo`.

    Parameters
    ----------
    lr : float
        Learning rate.
    betas : (float, float)
        ``β₁`` for the first moment; ``β₂`` for the factors L, R (1 = running sum)
        and, unless ``grafting_beta2`` is given, for the grafting second moment.
    eps : float
        Grafting epsilon, added to ``√v̂``.
    weight_decay : float
        Weight decay coefficient.
    weight_decay_type : {"decoupled", "l2"}
        "decoupled" (AdamW): ``−lr·weight_decay·param`` is added to the update;
        "l2" (Adam, SGD): ``weight_decay·param`` is added to the gradient first.
    nesterov : bool
        Use ``β₁m + (1−β₁)g`` in place of ``m`` (Nesterov momentum).
    bias_correction : bool
        Divide the moments by ``1−β₁ᵗ``, ``1−β₂'ᵗ`` (the latter for "adam" only).
    grafting : {"adam", "adagrad", "rmsprop", "sgd"}
        The elementwise direction each Shampoo block is rescaled to the norm of, and
        the update of parameters without factors: ``m̂/(√v̂ + eps)`` (adam),
        ``m̂/(√v + eps)`` with ``v`` a running sum of ``g²`` (adagrad) or its EMA
        (rmsprop, no bias correction, as ``torch.optim.RMSprop``), or ``m̂`` (sgd;
        keeps no second moment).
    grafting_beta2 : float, optional
        ``β₂'`` of the grafting second moment (adam, rmsprop). Default ``β₂``.
    momentum : float
        Heavy-ball momentum on the final (grafted) direction, ``u ← μu + d``,
        applied as ``−lr·u`` (Distributed Shampoo's ``momentum``); 0 keeps no buffer.
    maximize : bool
        Maximize the objective (the gradients are negated first).
    block_size : int or math.inf
        Largest block side (Distributed Shampoo's ``max_preconditioner_dim``);
        ``math.inf`` preconditions each parameter whole.
    precondition_frequency : int
        Steps between inverse-root refreshes.
    start_preconditioning_step : int, optional
        First step with Shampoo directions (and the first refresh). Default:
        ``precondition_frequency``.
    root_method : str
        Any :func:`matroot.inv_root` method: "auto" or a registered solver
        ("evd", "newton_db", "coupled_newton", "chebyshev", "minimax").
    matrix_eps : float
        Ridge of the factors: roots of ``L + matrix_eps·I``.
    root_options : RootOptions or dict, optional
        Further :func:`matroot.inv_root` keywords (``rtol``, ``tol``, ``max_iter``,
        ``scaling``, ``matmul_dtype``, ``compute_dtype``, ``certificate``,
        ``bound_certificate``, ``steps``, ``verdict``, ``fallback``), checked now by
        inv_root's own checks and kept as a :class:`~matroot.optim.RootOptions`. The
        optimizer's defaults (:mod:`matroot.optim.shampoo_core.root_options`): every
        kept root is certified to ``rtol=1e-2`` (relative Frobenius error against the
        exact root; a factor too ill-conditioned for that in float32, κ beyond about
        3e5 at p = 2 and 7e5 at p = 4, keeps its previous root and counts a failure),
        solved in fixed steps wherever the method has a rule, its verdict on the
        device (no host read) except for an adaptive loop under
        ``nonfinite_grads="raise"``.
    root_storage_dtype : {None, "float32", "bfloat16", "float16"}
        dtype the inverse roots are kept in between refreshes (None: the factors'
        dtype). Factors and all arithmetic stay float32 (float64 for float64
        parameters); a 16-bit root halves the roots' memory.
    symmetric_packing : bool
        Keep factors and inverse roots as packed upper triangles, ``n(n+1)/2`` numbers
        each instead of ``n²`` (Distributed Shampoo's ``use_symmetric_packing``). The
        factors hold the same values (accumulation is entrywise); a refresh unpacks one
        stack for the solver, a step unpacks one block group's roots at a time. On by
        default: it halves the factors' bytes for a few per cent of step time
        (docs/memory.rst); False keeps full ``n×n`` stacks.
    keep_roots : bool or None
        Keep the inverse roots between steps (True), or solve them at every step
        and drop each stack after its last use in that step (False; needs
        ``precondition_frequency=1``, Distributed Shampoo's default). False holds
        no roots in the state at all, with the same updates as True (to rounding
        with ``symmetric_packing``, whose kept roots are exactly symmetric); the
        one difference is the fallback: a matrix whose root fails that step gets
        the identity (its side unpreconditioned, the block still grafted) instead
        of its previous root. None (the default): False when the roots are
        refreshed at every step (``precondition_frequency=1``) and no
        ``root_storage_dtype`` is asked for, True otherwise; resolved in
        :attr:`keeps_roots`.
    precondition : bool
        False keeps the parameters on the grafting update with no factors at all.
    precondition_1d : bool
        Precondition vectors with one factor and root 2 (``L^(-1/2) g``) instead of
        the grafting update. Scalars always get the grafting update.
    max_preconditioned_dim : int or math.inf
        A dimension of a parameter's matrix view longer than this gets no factor,
        e.g. 4096 leaves a 50000×64 embedding one-sided: ``G R^(-1/2)`` with a
        64×64 ``R`` (Distributed Shampoo's ``inverse_exponent_override`` of 0 for
        that dimension). A dimension without a factor is not cut into blocks.
    max_factor_ratio : float
        A dimension longer than ``block_size`` gets no factor when its factors
        would hold more than this many numbers per parameter element (default 4):
        a 50000×64 embedding with ``block_size=1024`` keeps only its 64×64 factor
        (its 1024×1024 left factors would hold 16 numbers per element), while
        square and 4:1 weights keep both sides. ``math.inf`` builds every factor,
        as Distributed Shampoo does.
    skip_dims : tuple of int
        Dimensions of the matrix view (0: rows, 1: columns) that get no factor.
    stacked : bool
        Solve all equal-size factors in one call (True) or one call per factor
        (False, Distributed Shampoo's structure, for comparisons).
    nonfinite_grads : {"raise", "skip"}
        On a NaN/Inf gradient raise :class:`NonFiniteGradientError` (a host read
        per step), or skip the step (state untouched except ``skipped_steps``, zero
        updates). The torch optimizer skips on the device, without a host read;
        such a step still counts in its root schedule.

    Examples
    --------
    >>> import math
    >>> ShampooConfig(block_size=math.inf, grafting="sgd").second_moment_beta is None
    True
    >>> ShampooConfig(grafting="momentum")
    Traceback (most recent call last):
    ...
    ValueError: grafting='momentum' is not one of 'adam', 'adagrad', 'rmsprop', 'sgd'
    """

    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2
    weight_decay_type: str = "decoupled"
    nesterov: bool = False
    bias_correction: bool = True
    grafting: str = "adam"
    grafting_beta2: float | None = None
    momentum: float = 0.0
    maximize: bool = False
    block_size: int | float = 1024
    precondition_frequency: int = 10
    start_preconditioning_step: int | None = None
    root_method: str = "auto"
    matrix_eps: float = 1e-8
    root_options: RootOptions = field(default_factory=RootOptions)
    root_storage_dtype: str | None = None
    symmetric_packing: bool = True
    keep_roots: bool | None = None
    precondition: bool = True
    precondition_1d: bool = False
    max_preconditioned_dim: int | float = math.inf
    max_factor_ratio: float = DEFAULT_MAX_FACTOR_RATIO
    skip_dims: tuple = ()
    stacked: bool = True
    nonfinite_grads: str = "raise"

    grafting_options: GraftingOptions = field(init=False, repr=False, compare=False)
    blocking: BlockingOptions = field(init=False, repr=False, compare=False)
    root_solve: RootSolveOptions = field(init=False, repr=False, compare=False)
    storage: StorageOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        check_real(self.lr, "lr", 0.0)
        betas = tuple(self.betas)
        if len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {self.betas!r}")
        check_real(betas[0], "betas[0]", 0.0, 1.0, high_open=True)
        check_real(betas[1], "betas[1]", 0.0, 1.0)
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        check_real(self.weight_decay, "weight_decay", 0.0)
        check_one_of(self.weight_decay_type, "weight_decay_type", WEIGHT_DECAY_TYPES)
        check_real(self.momentum, "momentum", 0.0, 1.0, high_open=True)
        check_one_of(self.nonfinite_grads, "nonfinite_grads", NONFINITE_POLICIES)
        for name, group_type in GROUPS.items():
            group = group_type(**{f: getattr(self, f) for f in group_fields(group_type)})
            object.__setattr__(self, name, group)
            for f in group_fields(group_type):    # as the group normalised them
                object.__setattr__(self, f, getattr(group, f))
        self.root_options.check_with(self.root_method, self.matrix_eps)
        if self.keep_roots is False and self.precondition_frequency != 1:
            raise ValueError("keep_roots=False solves the inverse roots at every step: "
                             f"it needs precondition_frequency=1, got "
                             f"{self.precondition_frequency}")

    @classmethod
    def from_groups(cls, *groups, **hyperparameters) -> ShampooConfig:
        """A config from option groups and further flat hyperparameters.

        Examples
        --------
        >>> from matroot.optim.shampoo_core.option_groups import GraftingOptions, StorageOptions
        >>> config = ShampooConfig.from_groups(GraftingOptions(grafting="sgd"),
        ...                                    StorageOptions(symmetric_packing=True), lr=0.1)
        >>> config.grafting, config.symmetric_packing, config.lr
        ('sgd', True, 0.1)
        """
        merged: dict = {}
        for group in groups:
            if type(group) not in GROUPS.values():
                names = ", ".join(t.__name__ for t in GROUPS.values())
                raise TypeError(f"from_groups takes option groups ({names}), "
                                f"got {type(group).__name__}")
            merged.update({f: getattr(group, f) for f in group_fields(type(group))})
        clash = sorted(set(merged) & set(hyperparameters))
        if clash:
            raise ValueError(f"{clash} given both in a group and as keywords; give each once")
        return cls(**merged, **hyperparameters)

    @property
    def first_preconditioned_step(self) -> int:
        """The step at which Shampoo directions (and root refreshes) start."""
        return self.root_solve.first_preconditioned_step

    @property
    def keeps_roots(self) -> bool:
        """Whether inverse roots are kept between steps: ``keep_roots``, or for None
        whether they live longer than one step (refreshed less often than every
        step, or stored in a dtype of their own).

        Examples
        --------
        >>> ShampooConfig().keeps_roots, ShampooConfig(precondition_frequency=1).keeps_roots
        (True, False)
        """
        return self.storage.keeps_roots(self.precondition_frequency)

    @property
    def second_moment_beta(self) -> float | None:
        """``β₂'`` of the grafting second moment (1: running sum; None: none kept)."""
        return self.grafting_options.second_moment_beta(self.betas[1])

    @property
    def factor_policy(self) -> FactorPolicy:
        """Which dimensions of a parameter get factors, from the per-dimension fields."""
        return self.blocking.factor_policy

    def schedule_at(self, step) -> tuple:
        """``(refresh, started)`` at (1-based) ``step``: whether the inverse roots are
        recomputed, and whether Shampoo directions have started (Python bools for an
        int, boolean arrays for a 0-d integer array).

        Examples
        --------
        >>> ShampooConfig(precondition_frequency=5).schedule_at(5)
        (True, True)
        >>> ShampooConfig(precondition_frequency=5).schedule_at(7)
        (False, True)
        """
        started = step >= self.first_preconditioned_step
        if isinstance(step, numbers.Integral):
            started = bool(started)
        return self.refreshes_roots_at(step), started

    def refreshes_roots_at(self, step):
        """Whether the inverse roots are recomputed at (1-based) ``step`` (an int, or
        a 0-d integer array giving a boolean array)."""
        return self.root_solve.refreshes_roots_at(step)


#: torch optimizers' implementation switches and Adam's variants, which scripts pass
#: when they swap an optimizer for Shampoo; none has a meaning here.
_OTHER_OPTIMIZERS_KEYWORDS = ("foreach", "fused", "capturable", "differentiable",
                              "maximize", "amsgrad", "nesterov", "dampening")


#: Other optimizers' names (Distributed Shampoo's, mostly) whose nearest ShampooConfig
#: field would mislead (its ``epsilon`` is the factors' ridge, not Adam's ``eps``) or
#: that have none near; the whole mapping: docs/optimizer.rst, "Migrating from Meta's
#: Distributed Shampoo".
_DISTRIBUTED_SHAMPOO_NAMES = {
    "epsilon": "did you mean 'eps' (Adam's denominator floor, Keras's epsilon) or "
               "'matrix_eps' (the factors' ridge, Distributed Shampoo's epsilon)?",
    "max_preconditioner_dim": "Distributed Shampoo's max_preconditioner_dim is the block "
                              "size: use block_size (max_preconditioned_dim leaves longer "
                              "dimensions without a factor)",
    "use_decoupled_weight_decay": "use weight_decay_type='decoupled' or 'l2'",
    "grafting_config": "use grafting='adam', 'rmsprop', 'adagrad' or 'sgd' and "
                       "grafting_beta2",
    "preconditioner_config": "use root_method and root_options",
    "inv_factor_matrix_dtype": "use root_storage_dtype",
    "distributed_config": "use Shampoo's distributed= argument",
}


def check_keywords(names, where: str = "Shampoo", *, config: type = ShampooConfig,
                   renamed: Mapping[str, str] = _DISTRIBUTED_SHAMPOO_NAMES,
                   metadata: bool = False) -> None:
    """Raise a TypeError naming each of ``names`` that is not a field of ``config``, with
    the fix: for a name another optimizer uses, its entry in ``renamed`` or, for an
    implementation switch, to leave it out; else the nearest field name. With
    ``metadata`` (a parameter group's keys, which torch lets scripts use for their own
    ``"name"``, ``"initial_lr"``, ...) a name like none of those passes.

    Examples
    --------
    >>> check_keywords(["lr", "betas"])
    >>> check_keywords(["bias_corection"])
    Traceback (most recent call last):
    ...
    TypeError: Shampoo has no option 'bias_corection' (did you mean 'bias_correction'?)
    """
    known = [f.name for f in fields(config)]
    for name in names:
        if name in known:
            continue
        if name in renamed:
            hint = renamed[name]
        elif name in _OTHER_OPTIMIZERS_KEYWORDS:
            hint = "another optimizer's implementation or variant switch: leave it out"
        else:
            close = difflib.get_close_matches(name, known, n=1)
            if metadata and not close:
                continue
            hint = (f"did you mean {close[0]!r}?" if close else
                    f"see {config.__name__} for the options")
        raise TypeError(f"{where} has no option {name!r} ({hint})")
