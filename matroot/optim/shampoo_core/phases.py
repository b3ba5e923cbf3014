"""The phases of one Shampoo step, in the order :func:`matroot.optim.update` runs them.

1. :func:`accumulate_moments` — effective gradients, moments, grafting directions.
2. :func:`accumulate_factors` — the factors (and their carried λmax bounds) of the
   blocks that have a gradient, one batched product per run of equal-shape blocks.
3. :func:`refresh_roots` — one inverse-root solve per stack, when the schedule says so.
4. :func:`precondition` — grafted Shampoo directions once preconditioning has started
   (and, with ``keep_roots=False``, the roots solved just in time).
5. :func:`final_updates` — momentum and weight decay.

Each phase reads a :class:`StepContext`: what the step knows before it starts. Its
:class:`Schedule` holds the one host/device duality of a step: a schedule decided on
the host (Python bools) branches on the host, one kept on the device (0-d boolean
arrays under ``jax.jit``) branches and selects there.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from ... import _xp
from .blocking import BlockPlan, subgroup
from .config import ShampooConfig
from . import lists
from .grafting import effective_gradients, graft, grafting_directions
from .grafting import final_updates as final_updates_of
from .preconditioner import (
    FactorStacks,
    empty_stack,
    gather_blocks,
    identity_roots,
    precondition_blocks,
    refresh_inverse_roots,
    update_factors,
    write_blocks,
)

__all__ = ["Schedule", "StepContext", "Moments", "accumulate_moments", "accumulate_factors",
           "refresh_roots", "precondition", "final_updates", "compute_dtype_name",
           "root_dtype"]


class Schedule(NamedTuple):
    """Whether this step refreshes the inverse roots, and whether Shampoo directions
    have started: Python bools decided on the host, or 0-d boolean arrays on the
    device (counters kept as arrays, as under ``jax.jit``)."""

    refresh: Any
    started: Any

    @property
    def on_host(self) -> bool:
        return isinstance(self.refresh, bool)

    def branch(self, flag, if_true, if_false, *operands):
        """``if_true(*operands)`` where ``flag`` holds, else ``if_false(*operands)``.

        On the host ``if_true`` runs eagerly outside a ``torch.compile`` graph (the
        solvers' convergence checks read the host by design); on the device both
        are traced and one runs (``lax.cond``).
        """
        if self.on_host:
            return _xp.outside_torch_compile(if_true, *operands) if flag \
                else if_false(*operands)
        return _xp.cond(flag, if_true, if_false, *operands)

    def select(self, xp, flag, if_true, if_false):
        """``if_true`` where ``flag`` holds, else ``if_false`` (an elementwise select on
        the device)."""
        if self.on_host:
            return if_true if flag else if_false
        return xp.where(flag, if_true, if_false)

    def counted(self, xp, counter, flag, *, in_place: bool = False):
        """``counter`` plus one where ``flag`` holds (into an array ``counter`` itself
        when ``in_place``; untouched where the host says no)."""
        if self.on_host and not flag:
            return counter
        step = 1 if self.on_host else xp.astype(flag, xp.int32)
        if in_place and not isinstance(counter, int):
            counter += step
            return counter
        return counter + step


class StepContext(NamedTuple):
    """What every phase of one step reads.

    ``step_taken``: a 0-d boolean array, False where the step is skipped on the device
    (non-finite gradients), or None; ``in_place``: overwrite the state's arrays;
    ``skip``: the coefficients ``step_taken`` sets
    (:class:`~matroot.optim.shampoo_core.skipping.SkipCoefficients`), None with it.
    """

    xp: Any
    plan: BlockPlan
    config: ShampooConfig
    schedule: Schedule
    in_place: bool
    step_taken: Any
    skip: Any = None


class Moments(NamedTuple):
    """Per parameter (None where it has no gradient):
    the moments after this step, the effective gradient, the bias-corrected first
    moment and the grafting direction."""

    exp_avg: list
    exp_avg_sq: list
    effective: list
    m_hat: list
    adam: list


def _overwrites(ctx: StepContext) -> bool:
    return ctx.in_place and _xp.backend_name(ctx.xp) != "jax"


def compute_dtype_name(xp, dtype) -> str:
    """The dtype moments and factors are kept in: float64 for float64, else float32.

    Raises
    ------
    TypeError
        For non-floating dtypes.

    Examples
    --------
    >>> import numpy as np
    >>> compute_dtype_name(np, np.dtype("float16"))
    'float32'
    """
    if not xp.isdtype(dtype, "real floating"):
        raise TypeError(f"Shampoo optimizes real floating parameters, got dtype {dtype}")
    return _xp.work_dtype_name(xp, dtype)


def compute_dtype(xp, array):
    return getattr(xp, compute_dtype_name(xp, array.dtype))


def root_dtype(xp, config: ShampooConfig, stack_shape):
    """The dtype a stack's inverse roots are stored in."""
    name = config.root_storage_dtype or stack_shape.dtype
    dtype = getattr(xp, name, None)
    if dtype is None:
        raise ValueError(
            f"root_storage_dtype={name!r} is not a dtype of the parameters' array library "
            f"({getattr(xp, '__name__', xp)}); bfloat16 exists in PyTorch and JAX: use "
            "root_storage_dtype='float16' or None here")
    return dtype


def accumulate_moments(ctx: StepContext, grads, params, decays, exp_avg, exp_avg_sq,
                       param_steps) -> Moments:
    """Phase 1, elementwise: the moments and grafting directions of every parameter
    with a gradient (on a sharded rank, of every piece it owns), one list operation
    per term (:mod:`matroot.optim.shampoo_core.lists`). ``param_steps`` are the steps
    the bias corrections use (this step's, taken or not)."""
    xp, config = ctx.xp, ctx.config
    count = len(grads)
    exp_avg, exp_avg_sq = list(exp_avg), list(exp_avg_sq)
    effective, m_hat, adam = [None] * count, [None] * count, [None] * count
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return Moments(exp_avg, exp_avg_sq, effective, m_hat, adam)
    gs = [xp.astype(grads[i], compute_dtype(xp, grads[i]), copy=False) for i in present]
    if ctx.step_taken is not None:
        # A skipped step's gradients may hold NaN: zeros keep every product finite,
        # and the coefficients (times the flag) keep the moments as they were.
        gs = lists.zero_unless(xp, ctx.step_taken, gs)
    for i, g in zip(present, gs):
        if exp_avg[i] is None:
            exp_avg[i] = xp.zeros_like(g)
            if config.second_moment_beta is not None:
                exp_avg_sq[i] = xp.zeros_like(g)
    eff = effective_gradients(xp, gs, [params[i] for i in present],
                              [decays[i] for i in present], config)
    columns = grafting_directions(xp, eff, [exp_avg[i] for i in present],
                                  [exp_avg_sq[i] for i in present],
                                  [param_steps[i] for i in present], config,
                                  in_place=ctx.in_place, step_taken=ctx.skip)
    for target, column in zip((exp_avg, exp_avg_sq, m_hat, adam), columns):
        for i, value in zip(present, column):
            target[i] = value
    for i, value in zip(present, eff):
        effective[i] = value
    return Moments(exp_avg, exp_avg_sq, effective, m_hat, adam)


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


def accumulate_factors(ctx: StepContext, effective, stacks: FactorStacks) -> tuple:
    """Phase 2: the factors and bounds of every block with a gradient, and those runs
    of blocks (stacks first made here for a lazy state)."""
    xp, plan, config = ctx.xp, ctx.plan, ctx.config
    factors, roots, failures, bounds = (list(a) for a in stacks)
    views = [None if g is None else xp.reshape(g, layout.view)
             for g, layout in zip(effective, plan.params)]
    present = [g is not None for g in effective]
    runs = [run for group in plan.groups for run in _present_runs(group, present)]
    for run in runs:
        device = _xp.device_of(effective[run.blocks[0].param])
        for stack, _ in run.factor_slots:
            stack_shape = plan.stacks[stack]
            if factors[stack] is None:
                factors[stack], roots[stack], failures[stack], bounds[stack] = empty_stack(
                    stack_shape, xp, device, root_dtype=root_dtype(xp, config, stack_shape),
                    packed=config.symmetric_packing, keep_roots=config.keeps_roots)
            elif roots[stack] is None and config.keeps_roots:  # from a keep_roots=False state
                roots[stack] = identity_roots(stack_shape, xp, device,
                                              root_dtype(xp, config, stack_shape),
                                              packed=config.symmetric_packing)
        factors, bounds = update_factors(run, gather_blocks(run, views, xp), factors, bounds,
                                         config.betas[1], in_place=ctx.in_place,
                                         step_taken=ctx.skip)
    return FactorStacks(factors, roots, failures, bounds), runs


def _solve(ctx: StepContext, stacks: FactorStacks, s: int, roots, failures, bounds):
    """Stack ``s``'s roots, failure counts and bounds after one solve."""
    config = ctx.config
    return refresh_inverse_roots(ctx.plan.stacks[s], stacks.factors[s], roots, failures,
                                 bounds, method=config.root_method, eps=config.matrix_eps,
                                 options=config.root_options,
                                 no_sync=config.nonfinite_grads == "skip",
                                 in_place=_overwrites(ctx) and roots is not None)[:3]


def refresh_roots(ctx: StepContext, stacks: FactorStacks, refreshes) -> tuple:
    """Phase 3: every stack's inverse roots where the schedule says so (with
    ``keep_roots=False`` no root is kept: :func:`precondition` solves them). Returns
    the stacks and the refresh count."""
    if not ctx.plan.stacks:
        return stacks, refreshes
    if not ctx.config.keeps_roots:
        return (stacks._replace(roots=[None] * len(ctx.plan.stacks)),
                ctx.schedule.counted(ctx.xp, refreshes, ctx.schedule.refresh,
                                      in_place=_overwrites(ctx)))

    def refresh(roots, failures, bounds):
        roots, failures, bounds = list(roots), list(failures), list(bounds)
        for s, factors in enumerate(stacks.factors):
            if factors is not None:
                roots[s], failures[s], bounds[s] = _solve(ctx, stacks, s, roots[s],
                                                          failures[s], bounds[s])
        return roots, failures, bounds

    roots, failures, bounds = ctx.schedule.branch(
        ctx.schedule.refresh, refresh, lambda r, f, b: (list(r), list(f), list(b)),
        stacks.roots, stacks.failures, stacks.bounds)
    return (FactorStacks(stacks.factors, roots, failures, bounds),
            ctx.schedule.counted(ctx.xp, refreshes, ctx.schedule.refresh,
                                      in_place=_overwrites(ctx)))


def _sides(run):
    return [side for side in (run.left, run.right) if side is not None]


class _JustInTimeRoots:
    """keep_roots=False: the roots a run needs, solved when its first user comes and
    dropped after its last, so a step holds only the roots in use."""

    def __init__(self, ctx: StepContext, stacks: FactorStacks, runs):
        self.ctx, self.stacks = ctx, stacks
        self.failures, self.bounds = list(stacks.failures), list(stacks.bounds)
        self.last_use = {side[0]: j for j, run in enumerate(runs) for side in _sides(run)}
        self.live: dict = {}

    def for_run(self, j: int, run) -> list:
        ctx, stacks = self.ctx, self.stacks
        for s, _ in _sides(run):
            if s in self.live:
                continue

            def unstarted(failures, bounds, s=s):
                return (identity_roots(ctx.plan.stacks[s], ctx.xp, _xp.device_of(failures),
                                       stacks.factors[s].dtype), failures, bounds)

            self.live[s], self.failures[s], self.bounds[s] = ctx.schedule.branch(
                ctx.schedule.started, functools.partial(_solve, ctx, stacks, s, None),
                unstarted, self.failures[s], self.bounds[s])
        in_use = [self.live.get(s) for s in range(len(ctx.plan.stacks))]
        for s in [s for s in self.live if self.last_use[s] == j]:
            del self.live[s]
        return in_use


def precondition(ctx: StepContext, runs, moments: Moments, stacks: FactorStacks) -> tuple:
    """Phase 4: per parameter, the grafted Shampoo direction once preconditioning has
    started, the grafting direction otherwise. Returns the directions and the stacks
    (failure counts and bounds change where roots are solved just in time).

    Each run of blocks is gathered, preconditioned and grafted as one stack; the
    directions of a parameter that is one block are views of its run's result, those
    of parameters cut into several blocks are written in one copy
    (:func:`~matroot.optim.shampoo_core.preconditioner.write_blocks`)."""
    xp, plan, schedule = ctx.xp, ctx.plan, ctx.schedule
    directions = list(moments.adam)
    if schedule.on_host and not (schedule.started and runs):
        return directions, stacks
    m_views = [None if m is None else xp.reshape(m, layout.view)
               for m, layout in zip(moments.m_hat, plan.params)]
    a_views = [None if a is None else xp.reshape(a, layout.view)
               for a, layout in zip(moments.adam, plan.params)]
    just_in_time = None
    if not ctx.config.keeps_roots:
        # The runs that need the largest stack go first, then the next largest: each
        # big stack is solved when its first user comes and freed before the next.
        runs = sorted(runs, key=lambda run: -max(
            (plan.stacks[s].size for s, _ in _sides(run)), default=0))
        just_in_time = _JustInTimeRoots(ctx, stacks, runs)
    grafted = []
    for j, run in enumerate(runs):
        roots = stacks.roots if just_in_time is None else just_in_time.for_run(j, run)
        shampoo_dir = precondition_blocks(run, gather_blocks(run, m_views, xp), roots)
        grafted.append(graft(shampoo_dir, gather_blocks(run, a_views, xp)))
    out_views = write_blocks(xp, plan, runs, grafted, a_views)
    for i, (out, layout) in enumerate(zip(out_views, plan.params)):
        if out is not None:
            directions[i] = schedule.select(xp, schedule.started,
                                            xp.reshape(out, layout.shape), moments.adam[i])
    if just_in_time is not None:
        stacks = stacks._replace(failures=just_in_time.failures, bounds=just_in_time.bounds)
    return directions, stacks


def final_updates(ctx: StepContext, grads, directions, momentum, params, lrs,
                  decays) -> tuple:
    """Phase 5: ``−lr·(direction + weight_decay·param)`` (momentum on the direction
    first), zeros for a step skipped on the device, one list operation per term.
    Returns the updates and the momentum buffers."""
    xp, config = ctx.xp, ctx.config
    updates = [None] * len(grads)
    momentum = list(momentum)
    present = [i for i, d in enumerate(directions) if d is not None]
    if config.momentum:
        for i in present:
            if momentum[i] is None:
                momentum[i] = xp.zeros_like(directions[i])
    new, buffers = final_updates_of(
        xp, [directions[i] for i in present], [momentum[i] for i in present],
        [params[i] for i in present], [lrs[i] for i in present], [decays[i] for i in present],
        config, in_place=ctx.in_place, step_taken=ctx.skip)
    for i, u, b in zip(present, new, buffers):
        updates[i], momentum[i] = u, b
    return updates, momentum
