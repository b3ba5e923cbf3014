"""SOAP's state: one NamedTuple of arrays, counters and the block plan, and :func:`init`.

Parameters with factors keep their Adam moments *in the eigenbasis*, one
``(k, rows, cols)`` stack per block group (a rotated block has no meaning as a piece
of its parameter); the others (vectors, scalars, parameters with no factored side)
keep plain Adam moments, parameter-shaped. A grafting direction with moments of its
own (``grafting="adam"``, ...) keeps them in the parameter's basis, laid out as SOAP's
(per block group, and per parameter without factors), so a rank's share of the state
is cut the same way.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, NamedTuple

from ... import _xp
from ..shampoo_core.blocking import BlockPlan, FactorStackShape, plan_blocks
from ..shampoo_core.phases import compute_dtype_name
from ..shampoo_core.stack_io import assign
from .config import SOAPConfig

__all__ = ["SOAPState", "make_plan", "init", "copy_state", "state_bytes", "GRAFTING_FIELDS",
           "step_moments", "put_step_moments"]

#: The state's grafting moments (per parameter, then per block group).
GRAFTING_FIELDS = ("graft_exp_avg", "graft_exp_avg_sq", "block_graft_exp_avg",
                   "block_graft_exp_avg_sq")


class SOAPState(NamedTuple):
    """Optimizer state.

    Attributes
    ----------
    step : int or 0-d integer array
        Steps taken (skipped steps not counted); drives the refresh schedule.
    param_steps : tuple of int or of 0-d arrays
        Steps in which each parameter had a gradient; drives bias correction.
    exp_avg, exp_avg_sq : list of arrays or None
        Per parameter, Adam's moments of a parameter without factors (None for the others).
    block_exp_avg, block_exp_avg_sq : list of arrays
        Per block group of ``plan.groups``, the moments of its blocks in their
        eigenbasis, ``(k, *group.shape)``.
    factors, bases : list of arrays
        Per stack of ``plan.stacks``, the Kronecker factors and their eigenvectors
        (columns), ``(count, n, n)``; the bases start as the identity.
    residuals : list of arrays
        Per stack, each basis's relative residual at its last refresh
        (:attr:`matroot.eigenbasis.EigenbasisResult.residual`; 0 before the first).
    refreshes : int or 0-d integer array
        Refresh rounds run.
    skipped_steps : int or 0-d integer array
        Steps skipped for non-finite gradients.
    graft_exp_avg, graft_exp_avg_sq : list of arrays or None
        Per parameter without factors, the grafting direction's own moments
        (``grafting`` "adam", "rmsprop", "adagrad"; None otherwise and for the others).
    block_graft_exp_avg, block_graft_exp_avg_sq : list of arrays or None
        Per block group, its blocks' grafting moments in the parameter's basis,
        ``(k, *group.shape)`` (None unless the grafting keeps moments).
    plan : BlockPlan
    """

    step: Any
    param_steps: tuple
    exp_avg: list
    exp_avg_sq: list
    block_exp_avg: list
    block_exp_avg_sq: list
    factors: list
    bases: list
    residuals: list
    refreshes: Any
    skipped_steps: Any
    graft_exp_avg: list
    graft_exp_avg_sq: list
    block_graft_exp_avg: list
    block_graft_exp_avg_sq: list
    plan: BlockPlan


def make_plan(params, config: SOAPConfig) -> BlockPlan:
    """The block plan of these parameters (their shapes and dtypes only): Shampoo's,
    with the factors of one size and dtype in one stack whether their blocks are one-
    or two-sided (Shampoo keeps them apart for their different roots; SOAP takes none).

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim.soap import SOAPConfig, make_plan
    >>> plan = make_plan([np.zeros((64, 64)), np.zeros((64, 50000))], SOAPConfig())
    >>> [(s.size, s.count) for s in plan.stacks]
    [(64, 3)]
    """
    params = list(params)
    if not params:
        raise ValueError("params is empty")
    xp = _xp.array_namespace(*params)
    plan = plan_blocks([tuple(p.shape) for p in params],
                       [compute_dtype_name(xp, p.dtype) for p in params],
                       block_size=config.block_size, policy=config.factor_policy,
                       stacked=config.stacked)
    return _one_stack_per_size(plan) if config.stacked else plan


def _one_stack_per_size(plan: BlockPlan) -> BlockPlan:
    keys = sorted({(s.dtype, s.size) for s in plan.stacks})
    number = {key: i for i, key in enumerate(keys)}
    counts = dict.fromkeys(keys, 0)
    moved = []         # per old stack: (new stack, its first slot there)
    for s in plan.stacks:
        moved.append((number[(s.dtype, s.size)], counts[(s.dtype, s.size)]))
        counts[(s.dtype, s.size)] += s.count
    # root=0: SOAP's stacks feed eigenbases, not inverse roots.
    stacks = tuple(FactorStackShape(size=size, root=0, dtype=dtype, count=counts[(dtype, size)])
                   for dtype, size in keys)

    def slot(side):
        return None if side is None else (moved[side[0]][0], moved[side[0]][1] + side[1])

    groups = tuple(replace(g, left=slot(g.left), right=slot(g.right)) for g in plan.groups)
    return replace(plan, groups=groups, stacks=stacks)


def init(params, config: SOAPConfig, *, plan: BlockPlan | None = None,
         elementwise=None) -> SOAPState:
    """Initial state for a sequence of parameter arrays (one namespace and device).

    ``plan`` (default :func:`make_plan`) may be a part of it (a rank's share:
    factors, bases and block moments for its blocks only); ``elementwise``, the
    numbers of the parameters without factors whose Adam moments are kept here
    (default: all of them).

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim.soap import SOAPConfig, init
    >>> state = init([np.zeros((300, 60)), np.zeros(60)], SOAPConfig(block_size=128))
    >>> [(s.size, s.count) for s in state.plan.stacks]
    [(44, 1), (60, 3), (128, 2)]
    >>> [m.shape for m in state.block_exp_avg], state.exp_avg[0], state.exp_avg[1].shape
    ([(1, 44, 60), (2, 128, 60)], None, (60,))
    """
    params = list(params)
    plan = make_plan(params, config) if plan is None else plan
    xp = _xp.array_namespace(*params)
    device = _xp.device_of(params[0])

    def dtype(name):
        return getattr(xp, name)

    exp_avg = [xp.zeros(tuple(p.shape), dtype=dtype(compute_dtype_name(xp, p.dtype)),
                        device=device) if layout.kind == "elementwise"
               and (elementwise is None or i in elementwise) else None
               for i, (p, layout) in enumerate(zip(params, plan.params))]
    blocks = [xp.zeros((len(g.blocks), *g.shape), dtype=dtype(g.dtype), device=device)
              for g in plan.groups]
    factors = [xp.zeros((s.count, s.size, s.size), dtype=dtype(s.dtype), device=device)
               for s in plan.stacks]
    bases = [_xp.identity_stack(xp, s.size, dtype(s.dtype), device) * xp.ones(
        (s.count, 1, 1), dtype=dtype(s.dtype), device=device) for s in plan.stacks]
    residuals = [xp.zeros((s.count,), dtype=dtype(s.dtype), device=device)
                 for s in plan.stacks]
    kept = config.keeps_grafting_moments

    def grafting_zeros(arrays):
        return [xp.zeros_like(a) if kept and a is not None else None for a in arrays]

    return SOAPState(
        step=0, param_steps=(0,) * len(params), exp_avg=exp_avg,
        exp_avg_sq=[None if m is None else xp.zeros_like(m) for m in exp_avg],
        block_exp_avg=blocks, block_exp_avg_sq=[xp.zeros_like(b) for b in blocks],
        factors=factors, bases=bases, residuals=residuals, refreshes=0, skipped_steps=0,
        graft_exp_avg=grafting_zeros(exp_avg), graft_exp_avg_sq=grafting_zeros(exp_avg),
        block_graft_exp_avg=grafting_zeros(blocks), block_graft_exp_avg_sq=grafting_zeros(blocks),
        plan=plan)


#: The state's moments (SOAP's, then the grafting direction's), then its stacks.
_MOMENT_FIELDS = ("exp_avg", "exp_avg_sq", "block_exp_avg", "block_exp_avg_sq") \
    + GRAFTING_FIELDS
_ARRAY_FIELDS = _MOMENT_FIELDS + ("factors", "bases", "residuals")


def copy_state(state: SOAPState) -> SOAPState:
    """A copy of ``state`` whose arrays share no memory with it."""
    def copies(arrays):
        return [None if a is None else _xp.array_namespace(a).asarray(a, copy=True)
                for a in arrays]

    return state._replace(**{name: copies(getattr(state, name)) for name in _ARRAY_FIELDS})


def state_bytes(state: SOAPState) -> dict:
    """Bytes held by the state: ``moments``, ``factors`` (factors and bases), ``total``
    and ``per_parameter`` (total / parameter elements)."""
    def nbytes(arrays):
        return sum(math.prod(a.shape) * _xp.array_namespace(a).finfo(a.dtype).bits // 8
                   for a in arrays if a is not None)

    moments = sum(nbytes(getattr(state, n)) for n in _MOMENT_FIELDS)
    factors = nbytes(state.factors) + nbytes(state.bases) + nbytes(state.residuals)
    elements = sum(math.prod(p.shape) for p in state.plan.params)
    total = moments + factors
    return {"moments": moments, "factors": factors, "total": total,
            "per_parameter": total / elements if elements else 0.0}


def _whole(per_group, g, start, stop) -> bool:
    return start == 0 and stop == per_group[g].shape[0]


def step_moments(per_param, per_group, flat, runs) -> list:
    """The moments one step advances: those of the parameters ``flat`` (without
    factors), then of each run ``(group, start, stop, run)`` of blocks (its group's
    stack, or a view of its rows)."""
    return [per_param[i] for i in flat] + [
        per_group[g] if _whole(per_group, g, a, b) else per_group[g][a:b, ...]
        for g, a, b, _ in runs]


def put_step_moments(per_param, per_group, flat, runs, new, *, in_place: bool) -> tuple:
    """The lists ``per_param``, ``per_group`` with the advanced moments ``new`` (in the
    order of :func:`step_moments`) in their places."""
    per_param, per_group = list(per_param), list(per_group)
    for j, i in enumerate(flat):
        per_param[i] = new[j]
    for r, (g, a, b, _) in enumerate(runs):
        m = new[len(flat) + r]
        per_group[g] = m if _whole(per_group, g, a, b) else assign(
            per_group[g], (slice(a, b), ...), m, in_place=in_place)
    return per_param, per_group
