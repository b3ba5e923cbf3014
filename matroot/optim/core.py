"""Stacked-block Shampoo as a pair of functions, ``init`` and ``update``, on any array API.

The update of one step, for every parameter with a gradient ``g``:

1. Moments (elementwise, as AdamW): ``m ← β₁m + (1−β₁)g``,
   ``v ← β₂'v + (1−β₂')g²`` (``β₂' = grafting_beta2``, default ``β₂``; with
   ``β₂' = 1`` a running sum, AdaGrad). Bias corrections
   ``m̂ = m/(1−β₁ᵗ)``, ``v̂ = v/(1−β₂'ᵗ)``; the Adam direction is
   ``a = m̂ / (√v̂ + eps)``, exactly torch AdamW's.
2. Factors of every matrix block: ``L ← β₂L + (1−β₂)GGᵀ``, ``R ← β₂R + (1−β₂)GᵀG``
   (``β₂ = 1``: running sums), all blocks of one shape in one batched product.
3. Every ``precondition_frequency`` steps from ``start_preconditioning_step`` on,
   the inverse roots ``(L + matrix_eps·I)^(-1/4)`` (and of R) are recomputed, one
   :func:`matroot.inv_root_info` call per stack of equal-size factors. Roots that
   fail (non-finite, not converged) keep their previous value.
4. From ``start_preconditioning_step`` on, each block's direction is
   ``L^(-1/4) m̂ R^(-1/4)`` rescaled to the Frobenius norm of the block's Adam
   direction (grafting); before that, and for parameters left to the
   elementwise update, it is the Adam direction itself.
5. ``update = −lr·(direction + weight_decay·param)`` (decoupled weight decay).

``update`` is a pure function: it returns new arrays and a new state and never
writes into its inputs, on every backend (JAX included). ``in_place=True`` is
the fast path for mutable arrays (NumPy, CuPy, PyTorch): moments and factors
are overwritten where they lie (:func:`matroot.optim.preconditioner.assign` is
the one seam). The counters ``step`` and ``param_steps`` may be Python ints or
0-d integer arrays; with arrays (the optax shell under ``jax.jit``) the root
refresh is a device-side branch and the start of preconditioning a select.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import NamedTuple
from collections.abc import Callable

from .. import _xp
from ..solvers.registry import check_method
from .blocking import ELEMENTWISE, BlockPlan, plan_blocks, subgroup
from .preconditioner import (
    assign,
    gather_blocks,
    graft,
    init_stacks,
    precondition_blocks,
    refresh_inverse_roots,
    scatter_blocks,
    update_factors,
)

__all__ = [
    "ShampooConfig",
    "ShampooState",
    "GradientTransformation",
    "NonFiniteGradientError",
    "init",
    "make_plan",
    "update",
    "shampoo",
    "apply_updates",
    "copy_state",
    "state_bytes",
    "compute_dtype_name",
    "ROOT_OPTIONS",
    "NONFINITE_POLICIES",
]

#: The :func:`matroot.inv_root` keywords that ``root_options`` may set.
ROOT_OPTIONS = ("tol", "max_iter", "scaling", "matmul_dtype", "compute_dtype")
#: What ``update`` does with a NaN or Inf gradient.
NONFINITE_POLICIES = ("raise", "skip")


class NonFiniteGradientError(ValueError):
    """A gradient holds NaN or Inf and ``nonfinite_grads="raise"``."""


def _real(value, name, low=None, high=None, *, low_open=False, high_open=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    value = float(value)
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")
    return value


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class ShampooConfig:
    """Hyperparameters of :func:`init` / :func:`update`.

    Parameters
    ----------
    lr : float
        Learning rate.
    betas : (float, float)
        ``β₁`` for the first moment; ``β₂`` for the factors L, R (1 = running sum)
        and, unless ``grafting_beta2`` is given, for the Adam second moment.
    eps : float
        Adam's epsilon, added to ``√v̂``.
    weight_decay : float
        Decoupled (AdamW) weight decay.
    nesterov : bool
        Use ``β₁m + (1−β₁)g`` in place of ``m`` (Nesterov momentum).
    bias_correction : bool
        Divide the moments by ``1−β₁ᵗ``, ``1−β₂'ᵗ`` (never for ``β₂' = 1``).
    grafting_beta2 : float, optional
        ``β₂'`` of the Adam second moment; 1 gives AdaGrad grafting.
    block_size : int
        Largest block side (Distributed Shampoo's ``max_preconditioner_dim``).
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
    root_options : dict, optional
        Further :func:`matroot.inv_root` keywords (``tol``, ``max_iter``,
        ``scaling``, ``matmul_dtype``, ``compute_dtype``).
    precondition_1d : bool
        Precondition vectors with one factor and root 2 (``L^(-1/2) g``) instead of
        the Adam update. Scalars always get the Adam update.
    stacked : bool
        Solve all equal-size factors in one call (True) or one call per factor
        (False, Distributed Shampoo's structure, for comparisons).
    nonfinite_grads : {"raise", "skip"}
        On a NaN/Inf gradient raise :class:`NonFiniteGradientError`, or skip the
        step (state untouched except ``skipped_steps``, zero updates).
    """

    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2
    nesterov: bool = False
    bias_correction: bool = True
    grafting_beta2: float | None = None
    block_size: int = 1024
    precondition_frequency: int = 10
    start_preconditioning_step: int | None = None
    root_method: str = "auto"
    matrix_eps: float = 1e-8
    root_options: dict = field(default_factory=dict)
    precondition_1d: bool = False
    stacked: bool = True
    nonfinite_grads: str = "raise"

    def __post_init__(self):
        _real(self.lr, "lr", 0.0)
        betas = tuple(self.betas)
        if len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {self.betas!r}")
        _real(betas[0], "betas[0]", 0.0, 1.0, high_open=True)
        _real(betas[1], "betas[1]", 0.0, 1.0)
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        _real(self.eps, "eps", 0.0)
        _real(self.weight_decay, "weight_decay", 0.0)
        if self.grafting_beta2 is not None:
            _real(self.grafting_beta2, "grafting_beta2", 0.0, 1.0)
        _positive_int(self.block_size, "block_size")
        _positive_int(self.precondition_frequency, "precondition_frequency")
        start = self.start_preconditioning_step
        if start is not None and (isinstance(start, bool) or not isinstance(start, numbers.Integral)
                                  or start < 1):
            raise ValueError("start_preconditioning_step must be a positive integer or None, "
                             f"got {start!r}")
        check_method(self.root_method, "root_method")
        _real(self.matrix_eps, "matrix_eps", 0.0)
        options = dict(self.root_options or {})
        unknown = sorted(set(options) - set(ROOT_OPTIONS))
        if unknown:
            raise ValueError(f"root_options keys {unknown} are not inv_root options; allowed: "
                             + ", ".join(ROOT_OPTIONS))
        object.__setattr__(self, "root_options", options)
        if self.nonfinite_grads not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite_grads={self.nonfinite_grads!r} is not one of "
                             + ", ".join(repr(p) for p in NONFINITE_POLICIES))

    @property
    def first_preconditioned_step(self) -> int:
        """The step at which Shampoo directions (and root refreshes) start."""
        if self.start_preconditioning_step is None:
            return self.precondition_frequency
        return int(self.start_preconditioning_step)

    @property
    def second_moment_beta(self) -> float:
        """``β₂'`` of the Adam (grafting) second moment."""
        return self.betas[1] if self.grafting_beta2 is None else float(self.grafting_beta2)

    def refreshes_roots_at(self, step):
        """Whether the inverse roots are recomputed at (1-based) ``step`` (an int, or
        a 0-d integer array giving a boolean array)."""
        start = self.first_preconditioned_step
        if isinstance(step, numbers.Integral):
            return bool(step >= start and (step - start) % self.precondition_frequency == 0)
        return (step >= start) & ((step - start) % self.precondition_frequency == 0)


class ShampooState(NamedTuple):
    """Optimizer state: arrays plus integer counters and the static block plan.

    Attributes
    ----------
    step : int
        Steps taken (skipped steps not counted); drives the root schedule.
    param_steps : tuple of int
        Steps in which each parameter had a gradient; drives bias correction.
    exp_avg, exp_avg_sq : list of arrays
        First and second moments, parameter-shaped, in the compute dtype
        (float32 for 16-bit parameters).
    factors, roots : list of arrays
        One ``(count, n, n)`` stack per ``plan.stacks`` entry.
    root_failures : list of int32 arrays
        Per factor, the refreshes whose root was rejected.
    root_refreshes : int
        Refresh rounds run.
    skipped_steps : int
        Steps skipped for non-finite gradients.
    plan : BlockPlan
    """

    step: int
    param_steps: tuple
    exp_avg: list
    exp_avg_sq: list
    factors: list
    roots: list
    root_failures: list
    root_refreshes: int
    skipped_steps: int
    plan: BlockPlan


class GradientTransformation(NamedTuple):
    """An optax-style ``(init, update)`` pair."""

    init: Callable
    update: Callable


def compute_dtype_name(xp, dtype) -> str:
    """The dtype moments and factors are kept in: float64 for float64, else float32.

    Raises
    ------
    TypeError
        For non-floating dtypes.
    """
    if not xp.isdtype(dtype, "real floating"):
        raise TypeError(f"Shampoo optimizes real floating parameters, got dtype {dtype}")
    return "float64" if dtype == xp.float64 else "float32"


def _namespace(arrays, what):
    present = [a for a in arrays if a is not None]
    if not present:
        raise ValueError(f"{what} is empty")
    return _xp.array_namespace(*present)


def make_plan(params, config: ShampooConfig) -> BlockPlan:
    """The block plan :func:`init` makes for these parameters (shapes and dtypes only)."""
    params = list(params)
    xp = _namespace(params, "params")
    return plan_blocks([tuple(p.shape) for p in params],
                       [compute_dtype_name(xp, p.dtype) for p in params],
                       block_size=config.block_size, precondition_1d=config.precondition_1d,
                       stacked=config.stacked)


def init(params, config: ShampooConfig, *, plan: BlockPlan | None = None) -> ShampooState:
    """Initial state for a sequence of parameter arrays.

    Parameters
    ----------
    params : sequence of arrays
        All of one namespace and device (NumPy, CuPy, PyTorch, array-api-strict).
    config : ShampooConfig
    plan : BlockPlan, optional
        Keep factors for this plan's blocks only (a sharded run passes the part
        of :func:`make_plan` one rank owns). Default: :func:`make_plan`.

    Returns
    -------
    ShampooState

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim import ShampooConfig, init
    >>> state = init([np.zeros((300, 20)), np.zeros(20)], ShampooConfig(block_size=128))
    >>> [(s.size, s.count) for s in state.plan.stacks]
    [(20, 3), (44, 1), (128, 2)]
    """
    params = list(params)
    xp = _namespace(params, "params")
    device = _xp.device_of(params[0])
    plan = make_plan(params, config) if plan is None else plan
    names = [compute_dtype_name(xp, p.dtype) for p in params]
    stacks = init_stacks(plan, xp, device)

    def zeros(p, name):
        return xp.zeros(tuple(p.shape), dtype=getattr(xp, name), device=device)

    return ShampooState(
        step=0,
        param_steps=(0,) * len(params),
        exp_avg=[zeros(p, n) for p, n in zip(params, names)],
        exp_avg_sq=[zeros(p, n) for p, n in zip(params, names)],
        factors=stacks.factors,
        roots=stacks.roots,
        root_failures=stacks.failures,
        root_refreshes=0,
        skipped_steps=0,
        plan=plan,
    )


def _per_param(value, default, count, name):
    if value is None:
        value = default
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return [float(value)] * count
    values = [float(v) for v in value]
    if len(values) != count:
        raise ValueError(f"{name} has {len(values)} entries for {count} parameters")
    return values


def _nonfinite_params(xp, grads):
    """Indices of gradients with NaN/Inf; one host sync unless there are some."""
    flags = [xp.all(xp.isfinite(g)) for g in grads if g is not None]
    if not flags or bool(xp.all(xp.stack(flags))):
        return []
    return [i for i, g in enumerate(grads) if g is not None and not bool(xp.all(xp.isfinite(g)))]


def _present_runs(group, present):
    """Sub-groups of consecutive blocks whose parameter has a gradient this step."""
    runs, start = [], None
    for j, block in enumerate(group.blocks):
        if present[block.param] and start is None:
            start = j
        elif not present[block.param] and start is not None:
            runs.append(subgroup(group, start, j))
            start = None
    if start is not None:
        runs.append(group if start == 0 else subgroup(group, start, len(group.blocks)))
    return runs


def update(grads, state: ShampooState, params, config: ShampooConfig, *, lr=None,
           weight_decay=None, check_grads: bool = True, on_phase: Callable | None = None,
           in_place: bool = False):
    """One Shampoo step: updates to add to the parameters, and the advanced state.

    Parameters
    ----------
    grads : sequence of arrays or None
        One per parameter; None means the parameter is left as it is this step
        (its moments, factors and step count untouched).
    state : ShampooState
        From :func:`init` or a previous ``update``; left untouched unless ``in_place``.
    params : sequence of arrays
        The current parameters (for weight decay). May be None when
        ``weight_decay`` is 0 for all of them.
    config : ShampooConfig
    lr, weight_decay : float or sequence of float, optional
        Per-parameter overrides of ``config.lr`` / ``config.weight_decay``.
    check_grads : bool
        Apply ``config.nonfinite_grads`` (one host sync per step). A caller that
        checked already passes False.
    on_phase : callable, optional
        Called with "moments", "factors", "roots" (only on refresh steps),
        "precondition" and "updates" as each phase ends (for profiling).
    in_place : bool
        Overwrite the state's moments and factors instead of making new arrays
        (NumPy, CuPy, PyTorch; ignored on JAX, whose arrays are immutable).

    Returns
    -------
    updates : list of arrays or None
        ``param_new = param + update`` (see :func:`apply_updates`), in the
        compute dtype; None where the gradient was None.
    state : ShampooState

    Raises
    ------
    NonFiniteGradientError
        A gradient holds NaN/Inf and ``config.nonfinite_grads == "raise"``.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim import ShampooConfig, init, update, apply_updates
    >>> config = ShampooConfig(lr=0.1, precondition_frequency=1)
    >>> w = np.ones((3, 2))
    >>> state = init([w], config)
    >>> updates, state = update([np.ones((3, 2))], state, [w], config)
    >>> w, = apply_updates([w], updates)
    >>> state.step, state.root_refreshes, w.shape
    (1, 1, (3, 2))
    """
    grads = list(grads)
    plan = state.plan
    count = len(plan.params)
    if len(grads) != count:
        raise ValueError(f"got {len(grads)} gradients for {count} parameters")
    for i, (g, layout) in enumerate(zip(grads, plan.params)):
        if g is not None and tuple(g.shape) != layout.shape:
            raise ValueError(f"gradient {i} has shape {tuple(g.shape)}, parameter has "
                             f"{layout.shape}")
    xp = _namespace(grads + list(params or []), "grads")
    lrs = _per_param(lr, config.lr, count, "lr")
    decays = _per_param(weight_decay, config.weight_decay, count, "weight_decay")
    if params is None and any(decays):
        raise ValueError("params are needed for weight decay")
    present = [g is not None for g in grads]

    if check_grads:
        bad = _nonfinite_params(xp, grads)
        if bad:
            if config.nonfinite_grads == "raise":
                raise NonFiniteGradientError(
                    f"gradients of parameters {bad} contain NaN or Inf; pass "
                    "nonfinite_grads='skip' to skip such steps instead")
            updates = [None if g is None else xp.zeros_like(state.exp_avg[i])
                       for i, g in enumerate(grads)]
            return updates, state._replace(skipped_steps=state.skipped_steps + 1)

    def phase(name):
        if on_phase is not None:
            on_phase(name)

    beta1, beta2 = config.betas
    beta2_moment = config.second_moment_beta
    step = state.step + 1
    param_steps = tuple(s + 1 if p else s for s, p in zip(state.param_steps, present))

    # 1. Moments and Adam directions, elementwise.
    g_work, m_hat, adam = [None] * count, [None] * count, [None] * count
    exp_avg, exp_avg_sq = list(state.exp_avg), list(state.exp_avg_sq)
    for i, g in enumerate(grads):
        if g is None:
            continue
        m, v = exp_avg[i], exp_avg_sq[i]
        g = xp.astype(g, m.dtype, copy=False)
        g_work[i] = g
        m = assign(m, ..., m + (1.0 - beta1) * (g - m), in_place=in_place)
        if beta2_moment == 1.0:
            v = assign(v, ..., v + g * g, in_place=in_place)
        else:
            v = assign(v, ..., beta2_moment * v + (1.0 - beta2_moment) * (g * g),
                       in_place=in_place)
        exp_avg[i], exp_avg_sq[i] = m, v
        t = param_steps[i]
        corr1 = 1.0 - beta1 ** t if config.bias_correction else 1.0
        corr2 = 1.0 - beta2_moment ** t if config.bias_correction and beta2_moment < 1 else 1.0
        first = beta1 * m + (1.0 - beta1) * g if config.nesterov else m
        m_hat[i] = first / corr1
        adam[i] = m_hat[i] / (xp.sqrt(v) / corr2 ** 0.5 + config.eps)
    phase("moments")

    # 2. Factors, one batched product per group of equal-shape blocks.
    views = [None if g is None else xp.reshape(g, layout.view)
             for g, layout in zip(g_work, plan.params)]
    runs = [run for group in plan.groups for run in _present_runs(group, present)]
    factors = list(state.factors)
    for run in runs:
        factors = update_factors(run, gather_blocks(run, views, xp), factors, beta2,
                                 in_place=in_place)
    phase("factors")

    # 3. Inverse roots, one solver call per stack.
    def refresh(roots, failures):
        roots, failures = list(roots), list(failures)
        for s, spec in enumerate(plan.stacks):
            roots[s], failures[s], _ = refresh_inverse_roots(
                spec, factors[s], roots[s], failures[s], method=config.root_method,
                eps=config.matrix_eps, options=config.root_options)
        return roots, failures

    roots, failures = list(state.roots), list(state.root_failures)
    refreshes = state.root_refreshes
    if plan.stacks:
        due = config.refreshes_roots_at(step)
        if isinstance(due, bool):
            if due:
                roots, failures = refresh(roots, failures)
                refreshes += 1
                phase("roots")
        else:
            roots, failures = _xp.cond(due, refresh, lambda r, f: (list(r), list(f)),
                                       roots, failures)
            refreshes = refreshes + xp.astype(due, xp.int32)

    # 4. Directions: grafted Shampoo blocks once preconditioning has started.
    directions = list(adam)
    started = step >= config.first_preconditioned_step
    if isinstance(step, numbers.Integral):
        started = bool(started)
    if not isinstance(started, bool) or (started and runs):
        m_views = [None if m is None else xp.reshape(m, layout.view)
                   for m, layout in zip(m_hat, plan.params)]
        a_views = [None if a is None else xp.reshape(a, layout.view)
                   for a, layout in zip(adam, plan.params)]
        out_views = [None if (a is None or layout.kind == ELEMENTWISE)
                     else xp.zeros(layout.view, dtype=a.dtype, device=_xp.device_of(a))
                     for a, layout in zip(adam, plan.params)]
        for run in runs:
            shampoo_dir = precondition_blocks(run, gather_blocks(run, m_views, xp), roots)
            out_views = scatter_blocks(run, graft(shampoo_dir, gather_blocks(run, a_views, xp)),
                                       out_views)
        for i, (out, layout) in enumerate(zip(out_views, plan.params)):
            if out is not None:
                shaped = xp.reshape(out, layout.shape)
                # Counters on the device: select instead of branching on the host.
                directions[i] = shaped if isinstance(started, bool) else xp.where(
                    started, shaped, adam[i])
    phase("precondition")

    # 5. Updates with decoupled weight decay.
    updates = [None] * count
    for i, d in enumerate(directions):
        if d is None:
            continue
        u = -lrs[i] * d
        if decays[i]:
            u = u - (lrs[i] * decays[i]) * xp.astype(params[i], d.dtype, copy=False)
        updates[i] = u
    phase("updates")

    new_state = state._replace(step=step, param_steps=param_steps, exp_avg=exp_avg,
                               exp_avg_sq=exp_avg_sq, factors=factors, roots=roots,
                               root_failures=failures, root_refreshes=refreshes)
    return updates, new_state


def apply_updates(params, updates):
    """``param + update`` for each pair, computed in the update's dtype and cast back.

    A None update leaves its parameter as it is.
    """
    out = []
    for p, u in zip(params, updates):
        if u is None:
            out.append(p)
            continue
        xp = _xp.array_namespace(p, u)
        out.append(xp.astype(xp.astype(p, u.dtype, copy=False) + u, p.dtype, copy=False))
    return out


def copy_state(state: ShampooState) -> ShampooState:
    """A copy of ``state`` whose arrays share no memory with it."""
    def copies(arrays):
        return [_xp.array_namespace(a).asarray(a, copy=True) for a in arrays]

    return state._replace(exp_avg=copies(state.exp_avg), exp_avg_sq=copies(state.exp_avg_sq),
                          factors=copies(state.factors), roots=copies(state.roots),
                          root_failures=copies(state.root_failures))


def _nbytes(a) -> int:
    xp = _xp.array_namespace(a)
    if xp.isdtype(a.dtype, "real floating"):
        bits = xp.finfo(a.dtype).bits
    else:
        bits = xp.iinfo(a.dtype).bits
    return math.prod(a.shape) * bits // 8


def state_bytes(state: ShampooState) -> dict:
    """Bytes held by the state, by kind, and per optimized parameter element.

    Returns
    -------
    dict
        ``moments``, ``factors``, ``roots``, ``counters``, ``total`` (bytes) and
        ``per_parameter`` (total bytes / number of parameter elements).
    """
    moments = sum(_nbytes(a) for a in state.exp_avg + state.exp_avg_sq)
    factors = sum(_nbytes(a) for a in state.factors)
    roots = sum(_nbytes(a) for a in state.roots)
    counters = sum(_nbytes(a) for a in state.root_failures)
    total = moments + factors + roots + counters
    elements = sum(math.prod(p.shape) for p in state.plan.params)
    return {"moments": moments, "factors": factors, "roots": roots, "counters": counters,
            "total": total, "per_parameter": total / elements if elements else 0.0}


def shampoo(**hyperparameters) -> GradientTransformation:
    """An optax-style ``GradientTransformation`` for fixed hyperparameters.

    Parameters
    ----------
    **hyperparameters
        Any :class:`ShampooConfig` field.

    Returns
    -------
    GradientTransformation
        ``init(params) -> state`` and ``update(grads, state, params) -> (updates, state)``.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim import shampoo, apply_updates
    >>> opt = shampoo(lr=0.05, precondition_frequency=2)
    >>> params = [np.ones((4, 3)), np.zeros(3)]
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...     grads = [2 * params[0], params[1] - 1]
    ...     updates, state = opt.update(grads, state, params)
    ...     params = apply_updates(params, updates)
    >>> bool(np.all(params[0] < 1)), state.root_refreshes
    (True, 1)
    """
    config = ShampooConfig(**hyperparameters)

    def init_fn(params):
        return init(params, config)

    def update_fn(grads, state, params=None):
        return update(grads, state, params, config)

    return GradientTransformation(init_fn, update_fn)
