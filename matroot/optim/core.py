"""Stacked-block Shampoo as a pair of functions, ``init`` and ``update``, on any array API.

The update of one step, for every parameter with a gradient ``g``:

1. Elementwise (:mod:`matroot.optim.grafting`): the effective gradient (sign for
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
are overwritten where they lie (:func:`matroot.optim.preconditioner.assign` is
the one seam). The counters ``step`` and ``param_steps`` may be Python ints or
0-d integer arrays; with arrays (the optax shell under ``jax.jit``) the root
refresh is a device-side branch and the start of preconditioning a select. A
state made with ``init(..., lazy=True)`` holds None for every array until the
step that first needs it: moments from a parameter's first gradient, factor and
root stacks from the first gradient of a block in them (eager only: a traced
step needs every array to exist).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import _xp
from .blocking import ELEMENTWISE, BlockPlan, plan_blocks, subgroup
from .config import (
    NONFINITE_POLICIES,
    ROOT_OPTIONS,
    NonFiniteGradientError,
    ShampooConfig,
)
from .grafting import effective_gradient, final_update, grafting_direction
from .factor_bounds import unknown_bounds
from .preconditioner import (
    empty_stack,
    gather_blocks,
    graft,
    identity_roots,
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


class ShampooState(NamedTuple):
    """Optimizer state: arrays plus integer counters and the static block plan.

    Attributes
    ----------
    step : int or 0-d integer array
        Steps taken (skipped steps not counted); drives the root schedule unless
        :func:`update` is given one.
    param_steps : tuple of int or of 0-d arrays
        Steps in which each parameter had a gradient; drives bias correction.
    exp_avg, exp_avg_sq : list of arrays or None
        First and second moments, parameter-shaped, in the compute dtype
        (float32 for 16-bit parameters); None before a parameter's first
        gradient in a lazy state, and ``exp_avg_sq`` always for SGD grafting.
    factors, roots : list of arrays or None
        One ``(count, n, n)`` stack per ``plan.stacks`` entry (None until first
        needed in a lazy state); factors ``(count, n(n+1)/2)`` with ``symmetric_packing``,
        roots in ``root_storage_dtype``.
    root_failures : list of int32 arrays or None
        Per factor, the refreshes whose root was rejected.
    root_refreshes : int or 0-d integer array
        Refresh rounds run.
    skipped_steps : int or 0-d integer array
        Steps skipped for non-finite gradients.
    plan : BlockPlan
    momentum_buffer : list of arrays or None
        Per parameter, the momentum of the final update (None without momentum).
    factor_bounds : list of arrays or None
        Per stack, each factor's carried λmax bound and its floor, shape
        ``(count, 2)`` (:mod:`matroot.optim.factor_bounds`); None (or a None
        entry beside factors) where they are unknown: the next refresh finds them.
    """

    step: Any
    param_steps: tuple
    exp_avg: list
    exp_avg_sq: list
    factors: list
    roots: list
    root_failures: list
    root_refreshes: Any
    skipped_steps: Any
    plan: BlockPlan
    momentum_buffer: list | None = None
    factor_bounds: list | None = None


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


def _compute_dtype(xp, array):
    return getattr(xp, compute_dtype_name(xp, array.dtype))


def _namespace(arrays, what):
    present = [a for a in arrays if a is not None]
    if not present:
        raise ValueError(f"{what} is empty")
    return _xp.array_namespace(*present)


def make_plan(params, config: ShampooConfig, *, policies=None) -> BlockPlan:
    """The block plan :func:`init` makes for these parameters (shapes and dtypes only).

    ``policies`` (one :class:`~matroot.optim.blocking.FactorPolicy` per parameter)
    replaces ``config.factor_policy`` where parameters differ in it.
    """
    params = list(params)
    xp = _namespace(params, "params")
    return plan_blocks([tuple(p.shape) for p in params],
                       [compute_dtype_name(xp, p.dtype) for p in params],
                       block_size=config.block_size,
                       policy=config.factor_policy if policies is None else policies,
                       stacked=config.stacked)


def _root_dtype(xp, config: ShampooConfig, spec):
    name = config.root_storage_dtype or spec.dtype
    dtype = getattr(xp, name, None)
    if dtype is None:
        raise ValueError(
            f"root_storage_dtype={name!r} is not a dtype of the parameters' array library "
            f"({getattr(xp, '__name__', xp)}); bfloat16 exists in PyTorch and JAX: use "
            "root_storage_dtype='float16' or None here")
    return dtype


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
    >>> state = init([np.zeros((300, 20)), np.zeros(20)], ShampooConfig(block_size=128))
    >>> [(s.size, s.count) for s in state.plan.stacks]
    [(20, 3), (44, 1), (128, 2)]
    >>> init([np.zeros((300, 20))], ShampooConfig(), lazy=True).factors
    [None, None]
    """
    params = list(params)
    xp = _namespace(params, "params")
    device = _xp.device_of(params[0])
    plan = make_plan(params, config) if plan is None else plan
    stacks = init_stacks(plan, xp, device, lazy=lazy, packed=config.symmetric_packing,
                         root_dtypes=[_root_dtype(xp, config, s) for s in plan.stacks],
                         keep_roots=config.keeps_roots)
    count = len(params)
    moments = [None] * count if lazy else [
        xp.zeros(tuple(p.shape), dtype=getattr(xp, compute_dtype_name(xp, p.dtype)),
                 device=device) for p in params]

    def zeros_like_moments(keep):
        return [xp.zeros_like(m) if keep and m is not None else None for m in moments]

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


def _per_param(value, default, count, name):
    if value is None:
        value = default
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return [float(value)] * count
    values = [float(v) for v in value]
    if len(values) != count:
        raise ValueError(f"{name} has {len(values)} entries for {count} parameters")
    return values


def nonfinite_flags(grads) -> list:
    """Per gradient, whether it holds NaN/Inf (False for None); one host sync if all are finite.

    Examples
    --------
    >>> import numpy as np
    >>> nonfinite_flags([np.ones(2), None, np.array([1.0, np.nan])])
    [False, False, True]
    """
    present = [g for g in grads if g is not None]
    if not present:
        return [False] * len(grads)
    xp = _xp.array_namespace(*present)
    if bool(xp.all(xp.stack([xp.all(xp.isfinite(g)) for g in present]))):
        return [False] * len(grads)
    return [g is not None and not bool(xp.all(xp.isfinite(g))) for g in grads]


def all_finite(grads):
    """Whether every gradient is finite, as a 0-d boolean array on their device (no
    host read; None entries are skipped), for :func:`update`'s ``finite``.

    Examples
    --------
    >>> import numpy as np
    >>> bool(all_finite([np.ones(2), None, np.array([1.0, np.inf])]))
    False
    """
    present = [g for g in grads if g is not None]
    xp = _namespace(present, "grads")
    return xp.all(xp.stack([xp.all(xp.isfinite(g)) for g in present]))


def _advance(xp, count, by):
    """``count + 1``, or ``count + by`` for a 0-d boolean array ``by`` (a device-side
    step count that stands still where ``by`` is False)."""
    if by is None:
        return count + 1
    return count + xp.astype(by, count.dtype if hasattr(count, "dtype") else xp.int64)


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
    params = [None] * count if params is None else list(params)
    present = [g is not None for g in grads]

    if check_grads:
        bad = [i for i, flag in enumerate(nonfinite_flags(grads)) if flag]
        if bad:
            if config.nonfinite_grads == "raise":
                raise NonFiniteGradientError(
                    f"gradients of parameters {bad} contain NaN or Inf; pass "
                    "nonfinite_grads='skip' to skip such steps instead")
            updates = [None if g is None else
                       xp.zeros(g.shape, dtype=_compute_dtype(xp, g), device=_xp.device_of(g))
                       for g in grads]
            return updates, state._replace(skipped_steps=state.skipped_steps + 1)

    def phase(name):
        if on_phase is not None:
            on_phase(name)

    keep = finite
    step = _advance(xp, state.step, keep)
    param_steps = tuple(_advance(xp, s, keep) if p else s
                        for s, p in zip(state.param_steps, present))
    due, started = config.schedule_at(step) if schedule is None else schedule
    exp_avg, exp_avg_sq = list(state.exp_avg), list(state.exp_avg_sq)
    momentum = list(state.momentum_buffer or [None] * count)

    # 1. Moments and grafting directions, elementwise. A sharded rank keeps no moments
    # of parameters whose blocks all belong to other ranks: their updates arrive by the
    # all-gather, so here they are zeros.
    remote = plan.remote_params
    g_work, m_hat, adam = [None] * count, [None] * count, [None] * count
    for i, g in enumerate(grads):
        if g is None or i in remote:
            continue
        g = xp.astype(g, _compute_dtype(xp, g), copy=False)
        if exp_avg[i] is None:
            exp_avg[i] = xp.zeros_like(g)
            if config.second_moment_beta is not None:
                exp_avg_sq[i] = xp.zeros_like(g)
        g_work[i] = effective_gradient(xp, g, params[i], decays[i], config)
        exp_avg[i], exp_avg_sq[i], m_hat[i], adam[i] = grafting_direction(
            xp, g_work[i], exp_avg[i], exp_avg_sq[i], param_steps[i], config,
            in_place=in_place, keep=keep)
    phase("moments")

    # 2. Factors, one batched product per group of equal-shape blocks.
    factors, roots, failures = (list(state.factors), list(state.roots),
                                list(state.root_failures))
    # A state saved before bounds were carried has none: the next refresh finds them.
    bounds = [b if b is not None or f is None else
              unknown_bounds(f.shape[0], xp, f.dtype, _xp.device_of(f))
              for f, b in zip(factors, state.factor_bounds or [None] * len(factors))]
    views = [None if g is None else xp.reshape(g, layout.view)
             for g, layout in zip(g_work, plan.params)]
    runs = [run for group in plan.groups for run in _present_runs(group, present)]
    for run in runs:
        for stack, _ in run.factor_slots:
            spec = plan.stacks[stack]
            device = _xp.device_of(g_work[run.blocks[0].param])
            if factors[stack] is None:
                factors[stack], roots[stack], failures[stack], bounds[stack] = empty_stack(
                    spec, xp, device, root_dtype=_root_dtype(xp, config, spec),
                    packed=config.symmetric_packing, keep_roots=config.keeps_roots)
            elif roots[stack] is None and config.keeps_roots:  # from a keep_roots=False state
                roots[stack] = identity_roots(spec, xp, device, _root_dtype(xp, config, spec),
                                              packed=config.symmetric_packing)
        factors, bounds = update_factors(run, gather_blocks(run, views, xp), factors, bounds,
                                         config.betas[1], in_place=in_place, keep=keep)
    phase("factors")

    # 3. Inverse roots, one solver call per stack that has factors. The solvers' convergence
    # checks read the host by design: under torch.compile they run outside the graph.
    def solve(s, roots, failures, bounds):
        return refresh_inverse_roots(plan.stacks[s], factors[s], roots, failures, bounds,
                                     method=config.root_method, eps=config.matrix_eps,
                                     options=config.root_options)[:3]

    def refresh(roots, failures, bounds):
        roots, failures, bounds = list(roots), list(failures), list(bounds)
        for s in range(len(plan.stacks)):
            if factors[s] is not None:
                roots[s], failures[s], bounds[s] = solve(s, roots[s], failures[s], bounds[s])
        return roots, failures, bounds

    refreshes = state.root_refreshes
    if plan.stacks:
        if not config.keeps_roots:
            roots = [None] * len(plan.stacks)   # solved in step 4, stack by stack
        elif isinstance(due, bool):
            if due:
                roots, failures, bounds = _xp.outside_torch_compile(refresh, roots, failures,
                                                                    bounds)
                phase("roots")
        else:  # counters on the device (jax.jit): a device-side branch
            roots, failures, bounds = _xp.cond(
                due, refresh, lambda r, f, b: (list(r), list(f), list(b)),
                roots, failures, bounds)
        if isinstance(due, bool):
            refreshes = refreshes + int(due)
        else:
            refreshes = refreshes + xp.astype(due, xp.int32)

    def transient_roots(j, run, live, last_use):
        """keep_roots=False: solve the stacks the ``j``-th run needs that are not live
        yet, and drop those no later run needs, so a step holds only the roots in use."""
        for side in (run.left, run.right):
            if side is None or side[0] in live:
                continue
            s = side[0]
            if isinstance(due, bool):
                live[s], failures[s], bounds[s] = _xp.outside_torch_compile(
                    solve, s, None, failures[s], bounds[s])
            else:
                live[s], failures[s], bounds[s] = _xp.cond(
                    started, functools.partial(solve, s, None),
                    lambda f, b, s=s: (identity_roots(plan.stacks[s], xp, _xp.device_of(f),
                                                      factors[s].dtype), f, b),
                    failures[s], bounds[s])
        in_use = [live.get(s) for s in range(len(plan.stacks))]
        for s in [s for s in live if last_use[s] == j]:
            del live[s]
        return in_use

    # 4. Directions: grafted Shampoo blocks once preconditioning has started.
    directions = list(adam)
    if not isinstance(started, bool) or (started and runs):
        m_views = [None if m is None else xp.reshape(m, layout.view)
                   for m, layout in zip(m_hat, plan.params)]
        a_views = [None if a is None else xp.reshape(a, layout.view)
                   for a, layout in zip(adam, plan.params)]
        out_views = [None if (a is None or layout.kind == ELEMENTWISE)
                     else xp.zeros(layout.view, dtype=a.dtype, device=_xp.device_of(a))
                     for a, layout in zip(adam, plan.params)]
        def sides(run):
            return [side for side in (run.left, run.right) if side is not None]

        if not config.keeps_roots:
            # The runs that need the largest stack go first, then the next largest: each
            # big stack is solved when its first user comes and freed before the next.
            runs = sorted(runs, key=lambda run: -max(
                (plan.stacks[s].size for s, _ in sides(run)), default=0))
        last_use = {side[0]: j for j, run in enumerate(runs) for side in sides(run)}
        live: dict = {}
        for j, run in enumerate(runs):
            in_use = roots if config.keeps_roots else transient_roots(j, run, live, last_use)
            shampoo_dir = precondition_blocks(run, gather_blocks(run, m_views, xp), in_use)
            out_views = scatter_blocks(run, graft(shampoo_dir, gather_blocks(run, a_views, xp)),
                                       out_views)
        for i, (out, layout) in enumerate(zip(out_views, plan.params)):
            if out is not None:
                shaped = xp.reshape(out, layout.shape)
                # Counters on the device: select instead of branching on the host.
                directions[i] = shaped if isinstance(started, bool) else xp.where(
                    started, shaped, adam[i])
    phase("precondition")

    # 5. Updates: momentum, then decoupled weight decay.
    updates = [None] * count
    for i in remote:
        if grads[i] is not None:
            updates[i] = xp.zeros(grads[i].shape, dtype=_compute_dtype(xp, grads[i]),
                                  device=_xp.device_of(grads[i]))
    for i, d in enumerate(directions):
        if d is None:
            continue
        if config.momentum and momentum[i] is None:
            momentum[i] = xp.zeros_like(d)
        updates[i], momentum[i] = final_update(xp, d, momentum[i], params[i], lrs[i],
                                               decays[i], config, in_place=in_place, keep=keep)
        if keep is not None:
            updates[i] = xp.where(keep, updates[i], xp.zeros_like(updates[i]))
    phase("updates")

    skipped = state.skipped_steps
    if keep is not None:
        skipped = _advance(xp, skipped, ~keep)
    new_state = state._replace(
        step=step, param_steps=param_steps, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq,
        factors=factors, roots=roots, root_failures=failures, root_refreshes=refreshes,
        skipped_steps=skipped,
        momentum_buffer=momentum if config.momentum else state.momentum_buffer,
        factor_bounds=bounds)
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
        if arrays is None:
            return None
        return [None if a is None else _xp.array_namespace(a).asarray(a, copy=True)
                for a in arrays]

    return state._replace(exp_avg=copies(state.exp_avg), exp_avg_sq=copies(state.exp_avg_sq),
                          factors=copies(state.factors), roots=copies(state.roots),
                          root_failures=copies(state.root_failures),
                          momentum_buffer=copies(state.momentum_buffer),
                          factor_bounds=copies(state.factor_bounds))


def _nbytes(arrays) -> int:
    total = 0
    for a in arrays or ():
        if a is None:
            continue
        xp = _xp.array_namespace(a)
        info = xp.finfo if xp.isdtype(a.dtype, "real floating") else xp.iinfo
        total += math.prod(a.shape) * info(a.dtype).bits // 8
    return total


def state_bytes(state: ShampooState) -> dict:
    """Bytes held by the state, by kind, and per optimized parameter element.

    Returns
    -------
    dict
        ``moments`` (both moments and the momentum buffer), ``factors``, ``roots``,
        ``counters`` (failure counts and carried λmax bounds), ``total`` (bytes) and
        ``per_parameter`` (total bytes / number of parameter elements).
    """
    moments = _nbytes(state.exp_avg) + _nbytes(state.exp_avg_sq) + \
        _nbytes(state.momentum_buffer)
    factors = _nbytes(state.factors)
    roots = _nbytes(state.roots)
    counters = _nbytes(state.root_failures) + _nbytes(state.factor_bounds)
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
