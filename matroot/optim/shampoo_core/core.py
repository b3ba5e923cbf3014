"""Stacked-block Shampoo as a pair of functions, ``init`` and ``update``, on any array API.

The update of one step, for every parameter with a gradient ``g`` (each item is a
phase function of :mod:`matroot.optim.shampoo_core.phases`; :func:`update` validates, runs them
in order and assembles the new :class:`~matroot.optim.shampoo_core.state.ShampooState`):

1. Elementwise (:mod:`matroot.optim.shampoo_core.grafting`): the effective gradient (sign for
   ``maximize``, L2 weight decay), the moments and the grafting direction ``a``
   (Adam by default: ``m̂/(√v̂ + eps)``, exactly torch AdamW's).
2. Factors of every block: ``L ← β₂L + (1−β₂)GGᵀ``, ``R ← β₂R + (1−β₂)GᵀG``
   (``β₂ = 1``: running sums), all blocks of one shape in one batched product.
3. Every ``precondition_frequency`` steps from ``start_preconditioning_step`` on,
   the inverse roots ``(L + matrix_eps·I)^(-1/4)`` (and of R) are recomputed, one
   :func:`matroot.inv_root_info` call per stack of equal-size factors. Roots that
   fail (non-finite, not converged) keep their previous value.
4. From ``start_preconditioning_step`` on, each block's direction is
   ``L^(-1/4) m̂ R^(-1/4)`` rescaled to the Frobenius norm of the block's grafting
   direction; before that, and for parameters without factors, it is the
   grafting direction itself.
5. ``update = −lr·(direction + weight_decay·param)`` (decoupled weight decay;
   momentum on the direction first when ``momentum > 0``).

``update`` is a pure function: it returns new arrays and a new state and never
writes into its inputs, on every backend (JAX included). ``in_place=True`` is
the fast path for mutable arrays (NumPy, CuPy, PyTorch): moments and factors
are overwritten where they lie (:func:`matroot.optim.shampoo_core.preconditioner.assign` is
the one seam). The counters ``step`` and ``param_steps`` may be Python ints or
0-d integer arrays; with arrays (the optax shell under ``jax.jit``) the root
refresh is a device-side branch and the start of preconditioning a select. A
state made with ``init(..., lazy=True)`` holds None for every array until the
step that first needs it: moments from a parameter's first gradient, factor and
root stacks from the first gradient of a block in them (eager only: a traced
step needs every array to exist).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import NamedTuple

from ... import _xp
from .blocking import BlockPlan, plan_blocks
from .config import (
    NONFINITE_POLICIES,
    ROOT_OPTIONS,
    NonFiniteGradientError,
    ShampooConfig,
    check_keywords,
)
from .factor_bounds import unknown_bounds
from .phases import (
    Schedule,
    StepContext,
    accumulate_factors,
    accumulate_moments,
    compute_dtype,
    compute_dtype_name,
    final_updates,
    precondition,
    refresh_roots,
    root_dtype,
)
from .counters import advance, advance_param_steps
from .gradients import all_finite, apply_nonfinite_policy, check_gradients, nonfinite_flags
from .preconditioner import FactorStacks, init_stacks
from .skipping import skip_coefficients
from .state import ShampooState, copy_state, state_bytes

__all__ = [
    "ShampooConfig",
    "ShampooState",
    "GradientTransformation",
    "NonFiniteGradientError",
    "init",
    "make_plan",
    "nonfinite_flags",
    "all_finite",
    "update",
    "shampoo",
    "apply_updates",
    "copy_state",
    "state_bytes",
    "compute_dtype_name",
    "ROOT_OPTIONS",
    "NONFINITE_POLICIES",
]


class GradientTransformation(NamedTuple):
    """An optax-style ``(init, update)`` pair."""

    init: Callable
    update: Callable


def _namespace(arrays, what):
    present = [a for a in arrays if a is not None]
    if not present:
        raise ValueError(f"{what} is empty")
    return _xp.array_namespace(*present)


def make_plan(params, config: ShampooConfig, *, policies=None) -> BlockPlan:
    """The block plan :func:`init` makes for these parameters (shapes and dtypes only).

    ``policies`` (one :class:`~matroot.optim.shampoo_core.blocking.FactorPolicy` per parameter)
    replaces ``config.factor_policy`` where parameters differ in it.
    """
    params = list(params)
    xp = _namespace(params, "params")
    return plan_blocks([tuple(p.shape) for p in params],
                       [compute_dtype_name(xp, p.dtype) for p in params],
                       block_size=config.block_size,
                       policy=config.factor_policy if policies is None else policies,
                       stacked=config.stacked)


def init(params, config: ShampooConfig, *, plan: BlockPlan | None = None,
         lazy: bool = False) -> ShampooState:
    """Initial state for a sequence of parameter arrays.

    Parameters
    ----------
    params : sequence of arrays
        All of one namespace and device (NumPy, CuPy, PyTorch, array-api-strict).
    config : ShampooConfig
    plan : BlockPlan, optional
        Keep factors for this plan's blocks only (a sharded run passes the part
        of :func:`make_plan` one rank owns). Default: :func:`make_plan`.
    lazy : bool
        Allocate no arrays now: each is made by the :func:`update` that first
        needs it, so parameters that never get a gradient cost nothing.

    Returns
    -------
    ShampooState

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim import ShampooConfig, init
    >>> state = init([np.zeros((300, 60)), np.zeros(60)], ShampooConfig(block_size=128))
    >>> [(s.size, s.count) for s in state.plan.stacks]
    [(44, 1), (60, 3), (128, 2)]
    >>> init([np.zeros((300, 20))], ShampooConfig(), lazy=True).factors
    [None, None]
    """
    params = list(params)
    # A sharded rank may own nothing of a small family: no parameters, no stacks.
    xp = _namespace(params, "params") if params or plan is None else None
    device = _xp.device_of(params[0]) if params else None
    plan = make_plan(params, config) if plan is None else plan
    stacks = init_stacks(plan, xp, device, lazy=lazy, packed=config.symmetric_packing,
                         root_dtypes=[root_dtype(xp, config, s) for s in plan.stacks],
                         keep_roots=config.keeps_roots)
    count = len(params)
    moments = [None] * count if lazy or xp is None else [
        xp.zeros(tuple(p.shape), dtype=getattr(xp, compute_dtype_name(xp, p.dtype)),
                 device=device) for p in params]

    def zeros_like_moments(wanted):
        return [xp.zeros_like(m) if wanted and m is not None else None for m in moments]

    return ShampooState(
        step=0,
        param_steps=(0,) * count,
        exp_avg=moments,
        exp_avg_sq=zeros_like_moments(config.second_moment_beta is not None),
        factors=stacks.factors,
        roots=stacks.roots,
        root_failures=stacks.failures,
        root_refreshes=0,
        skipped_steps=0,
        plan=plan,
        momentum_buffer=zeros_like_moments(bool(config.momentum)),
        factor_bounds=stacks.bounds,
    )


#: The error of an update with weight decay but no parameters.
DECAY_NEEDS_PARAMS = ("weight decay reads the parameters: pass them to update "
                      "(update(grads, state, params)), or set weight_decay=0")


def _per_param(value, default, count, name):
    if value is None:
        value = default
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return [float(value)] * count
    values = [float(v) for v in value]
    if len(values) != count:
        raise ValueError(f"{name} has {len(values)} entries for {count} parameters")
    return values


def update(grads, state: ShampooState, params, config: ShampooConfig, *, lr=None,
           weight_decay=None, check_grads: bool = True, on_phase: Callable | None = None,
           in_place: bool = False, schedule: tuple | None = None, finite=None):
    """One Shampoo step: updates to add to the parameters, and the advanced state.

    Parameters
    ----------
    grads : sequence of arrays or None
        One per parameter; None means the parameter is left as it is this step
        (its moments, factors and step count untouched).
    state : ShampooState
        From :func:`init` or a previous ``update``; left untouched unless ``in_place``.
    config : ShampooConfig
    lr, weight_decay : float or sequence of float, optional
        Per-parameter overrides of ``config.lr`` / ``config.weight_decay``.
    params : sequence of arrays
        The current parameters (for weight decay). May be None when
        ``weight_decay`` is 0 for all of them.
    check_grads : bool
        Apply ``config.nonfinite_grads`` (one host sync per step). A caller that
        checked already passes False.
    on_phase : callable, optional
        Called with "moments", "factors", "roots" (only on refresh steps, and not
        with ``keep_roots=False``, whose roots are solved within "precondition"),
        "precondition" and "updates" as each phase ends (for profiling).
    in_place : bool
        Overwrite the state's moments and factors instead of making new arrays
        (NumPy, CuPy, PyTorch; ignored on JAX, whose arrays are immutable).
    schedule : (bool, bool), optional
        ``(refresh, started)`` decided by the caller from a host-side step count
        (see :meth:`ShampooConfig.schedule_at`), so that counters kept as device
        arrays are never read on the host. Default: from ``state.step``.
    finite : 0-d boolean array, optional
        Whether every gradient is finite, on the device: where False the step is
        skipped without a host read (moments, factors, momentum, ``step`` and
        ``param_steps`` keep their values, the updates are zeros and
        ``skipped_steps`` counts it). Made by :func:`all_finite`; used with
        ``check_grads=False``. The inverse roots are still refreshed when
        ``schedule`` says so (from the unchanged factors).

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
    grads = check_gradients(grads, state.plan)
    plan = state.plan
    count = len(plan.params)
    xp = _namespace(grads + list(params or []), "grads")
    lrs = _per_param(lr, config.lr, count, "lr")
    decays = _per_param(weight_decay, config.weight_decay, count, "weight_decay")
    if params is None and any(decays):
        raise ValueError(DECAY_NEEDS_PARAMS)
    params = [None] * count if params is None else list(params)
    present = [g is not None for g in grads]

    if check_grads:
        bad = [i for i, flag in enumerate(nonfinite_flags(grads)) if flag]
        if apply_nonfinite_policy(bad, config.nonfinite_grads):
            updates = [None if g is None else
                       xp.zeros(g.shape, dtype=compute_dtype(xp, g), device=_xp.device_of(g))
                       for g in grads]
            return updates, state._replace(skipped_steps=state.skipped_steps + 1)

    def phase(name):
        if on_phase is not None:
            on_phase(name)

    step_taken = finite
    overwrite = in_place and _xp.backend_name(xp) != "jax"
    step = advance(xp, state.step, step_taken, in_place=overwrite)
    this_step, param_steps = advance_param_steps(xp, state.param_steps, present, step_taken,
                                                 in_place=overwrite)
    ctx = StepContext(xp, plan, config, Schedule(*(config.schedule_at(step) if schedule is None
                                                   else schedule)), in_place, step_taken,
                      skip_coefficients(step_taken, config))
    moments = accumulate_moments(ctx, grads, params, decays, state.exp_avg, state.exp_avg_sq,
                                 this_step)
    phase("moments")
    stacks, runs = accumulate_factors(ctx, moments.effective, _stacks_of(xp, state))
    phase("factors")
    stacks, refreshes = refresh_roots(ctx, stacks, state.root_refreshes)
    if ctx.schedule.on_host and ctx.schedule.refresh and config.keeps_roots and plan.stacks:
        phase("roots")
    directions, stacks = precondition(ctx, runs, moments, stacks)
    phase("precondition")
    updates, momentum = final_updates(ctx, grads, directions,
                                      state.momentum_buffer or [None] * count, params, lrs,
                                      decays)
    phase("updates")

    skipped = state.skipped_steps
    if step_taken is not None:
        skipped = advance(xp, skipped, ~step_taken, in_place=overwrite)
    new_state = state._replace(
        step=step, param_steps=param_steps, exp_avg=moments.exp_avg,
        exp_avg_sq=moments.exp_avg_sq, factors=stacks.factors, roots=stacks.roots,
        root_failures=stacks.failures, root_refreshes=refreshes, skipped_steps=skipped,
        momentum_buffer=momentum if config.momentum else state.momentum_buffer,
        factor_bounds=stacks.bounds)
    return updates, new_state


def _stacks_of(xp, state: ShampooState) -> FactorStacks:
    """The state's per-stack arrays; a state saved before bounds were carried has none,
    so the next refresh finds them."""
    bounds = [b if b is not None or f is None else
              unknown_bounds(f.shape[0], xp, f.dtype, _xp.device_of(f))
              for f, b in zip(state.factors, state.factor_bounds or [None] * len(state.factors))]
    return FactorStacks(list(state.factors), list(state.roots), list(state.root_failures),
                        bounds)


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
    check_keywords(hyperparameters, "shampoo")
    config = ShampooConfig(**hyperparameters)

    def init_fn(params):
        return init(params, config)

    def update_fn(grads, state, params=None):
        return update(grads, state, params, config)

    return GradientTransformation(init_fn, update_fn)
