"""Stacked SOAP as a pair of functions, ``init`` and ``update``, on any array API.

SOAP (Vyas et al., 2024, arXiv 2409.11321) is Adam run in the eigenbasis of Shampoo's
factors (eigenvalue-corrected Shampoo, George et al., 2018). One step, for the
parameters with a gradient, on the per-stack path Shampoo's core uses
(:mod:`matroot.optim.shampoo_core.stack_io`, :mod:`~matroot.optim.shampoo_core.lists`):

1. The effective gradient (sign for ``maximize``, L2 decay;
   :func:`~matroot.optim.shampoo_core.grafting.effective_gradients`); the blocks of
   each shape gathered into one ``(k, r, c)`` stack.
2. ``G̃ = Q_Lᵀ·G·Q_R``; Adam in the eigenbasis, ``m̃ ← β₁m̃ + (1−β₁)G̃``,
   ``ṽ ← β₂ṽ + (1−β₂)G̃²``, ``D̃ = m̂/(√v̂ + eps)`` with bias corrections
   (:func:`~matroot.optim.shampoo_core.grafting.grafting_directions`, one list operation
   per term for every stack and every unfactored parameter together); back,
   ``D = Q_L·D̃·Q_Rᵀ``, written to the parameters once per block shape.
   With ``grafting``, each block's ``D`` is rescaled to the norm of its grafting
   direction (before ``start_preconditioning_step``, replaced by it; below).
3. ``update = −lr·(D + weight_decay·param)`` (decoupled;
   :func:`~matroot.optim.shampoo_core.grafting.final_updates`).
4. Factors: ``L ← β·L + (1−β)·G·Gᵀ``, ``R ← β·R + (1−β)·Gᵀ·G`` (``β`` is
   ``shampoo_beta``, default ``β₂``), one batched product per block shape.
5. On refresh steps (``start_preconditioning_step`` and every
   ``precondition_frequency`` after), every stack's eigenvectors from its previous
   ones, one :func:`matroot.refresh_eigenbasis` call per stack; the moments rotated
   into the new basis (:mod:`.rotation`), which serves from the next step on (SOAP's
   order). Until the first refresh the basis is the identity: the step is AdamW's.

Parameters without a factored side (vectors, scalars, and with
``max_preconditioned_dim`` both sides too long) take step 2 with ``Q = I``: AdamW.
Non-finite gradients follow ``nonfinite_grads`` as in Shampoo.
"""

from __future__ import annotations

import numbers

from ... import _xp
from ..shampoo_core import lists
from ..shampoo_core.blocking import subgroup
from ..shampoo_core.core import DECAY_NEEDS_PARAMS, GradientTransformation, _per_param
from ..shampoo_core.counters import advance, advance_param_steps
from ..shampoo_core.gradients import (all_finite, apply_nonfinite_policy, check_gradients,
                                      nonfinite_params)
from ..shampoo_core.grafting import effective_gradients, final_updates, graft, \
    grafting_directions
from ..shampoo_core.phases import Schedule, compute_dtype
from ..shampoo_core.stack_io import gather_blocks, write_blocks
from .config import SOAPConfig, check_soap_keywords
from .rotation import accumulate_factors, from_eigenbasis, refresh_bases, side_slots, \
    to_eigenbasis
from .state import SOAPState, init, put_step_moments, step_moments

__all__ = ["update", "soap", "all_finite", "nonfinite_params", "screen"]


def screen(xp, grads, state: SOAPState, config: SOAPConfig):
    """Shampoo's non-finite policy on the host: None when every gradient is finite, else
    raise (``"raise"``) or return the skipped step's zero updates and state (``"skip"``)."""
    if not apply_nonfinite_policy(nonfinite_params(xp, grads), config.nonfinite_grads):
        return None
    return ([None if g is None else xp.zeros(g.shape, dtype=compute_dtype(xp, g),
                                              device=_xp.device_of(g)) for g in grads],
            state._replace(skipped_steps=state.skipped_steps + 1))


def _runs(plan, present):
    """``(group number, start, stop, run)`` for every run of consecutive blocks of a
    group whose parameters have a gradient."""
    out = []
    for g, group in enumerate(plan.groups):
        start = None
        for j, block in enumerate(group.blocks + (None,)):
            if block is not None and present[block.param]:
                start = j if start is None else start
            elif start is not None:
                whole = start == 0 and j == len(group.blocks)
                out.append((g, start, j, group if whole else subgroup(group, start, j)))
                start = None
    return out


def _run_step(xp, this_step, run, like):
    """The bias-correction step of a run: one count shared by its blocks, else one per
    block, broadcast over the block's entries."""
    steps = [this_step[b.param] for b in run.blocks]
    first = steps[0]
    if all(s is first for s in steps) or (isinstance(first, numbers.Integral) and all(
            isinstance(s, numbers.Integral) and s == first for s in steps)):
        return first
    column = xp.stack([xp.asarray(s, dtype=like.dtype, device=_xp.device_of(like))
                       for s in steps])
    return xp.reshape(column, (len(steps),) + (1,) * (like.ndim - 1))


# --- grafting (SOAPConfig.grafting) ----------------------------------------------------
#
# Distributed Shampoo's rule for its grafting_config, with Shampoo's math
# (shampoo_core.grafting: grafting_directions for the grafting direction a, graft for
# the rescaling; one copy for both optimizers). From start_preconditioning_step on each
# block's SOAP direction D becomes ‖a‖_F/‖D‖_F·D (per block of a factored parameter, per
# parameter without factors); before it the step is a itself. For "sgd", a = m̂ is SOAP's
# own: a block's is kept in its eigenbasis, where it has the norm of the parameter-basis
# m̂ (orthonormal bases), so it is grafted there at no cost in state. "adam", "rmsprop"
# and "adagrad" keep moments of their own, in the parameter's basis.

def check_grafting_state(state: SOAPState, config: SOAPConfig) -> None:
    """A ValueError unless ``state`` holds the grafting moments ``config`` needs (a state
    made for another ``grafting``)."""
    kept = any(a is not None for a in state.graft_exp_avg + state.block_graft_exp_avg)
    expected = config.keeps_grafting_moments and bool(
        state.plan.groups or any(a is not None for a in state.exp_avg))
    if kept != expected:
        raise ValueError(f"the SOAP state was made for another grafting than "
                         f"grafting={config.grafting!r} ({'with' if kept else 'without'} "
                         "grafting moments): make it with init(params, config) of this "
                         "config, or keep the grafting it was made with")


def advance_grafting(xp, state: SOAPState, config: SOAPConfig, flat, runs, gradients, steps, *,
                     in_place: bool, step_taken=None) -> tuple:
    """Advance the grafting moments of the parameters ``flat`` and the block ``runs``
    (``gradients`` and ``steps`` in that order, blocks in the parameter's basis).

    Returns
    -------
    fields : dict
        The state's new grafting moment lists.
    directions : list
        The grafting directions, in the order of ``gradients``.
    """
    method = config.grafting_method
    assert method is not None, "advance_grafting needs a grafting"
    new_m, new_v, _, directions = grafting_directions(
        xp, gradients,
        step_moments(state.graft_exp_avg, state.block_graft_exp_avg, flat, runs),
        step_moments(state.graft_exp_avg_sq, state.block_graft_exp_avg_sq, flat, runs),
        steps, method, in_place=in_place, step_taken=step_taken)
    m, block_m = put_step_moments(state.graft_exp_avg, state.block_graft_exp_avg, flat, runs,
                                  new_m, in_place=in_place)
    v, block_v = put_step_moments(state.graft_exp_avg_sq, state.block_graft_exp_avg_sq, flat,
                                  runs, new_v, in_place=in_place)
    return {"graft_exp_avg": m, "graft_exp_avg_sq": v, "block_graft_exp_avg": block_m,
            "block_graft_exp_avg_sq": block_v}, directions


def grafted(xp, started, blocks, grafting_blocks):
    """The ``(k, ...)`` directions ``blocks`` rescaled block by block to the norms of
    ``grafting_blocks`` where ``started`` (a bool, or a 0-d boolean array on the
    device), ``grafting_blocks`` themselves where not."""
    if isinstance(started, bool):
        return graft(blocks, grafting_blocks) if started else grafting_blocks
    return xp.where(started, graft(blocks, grafting_blocks), grafting_blocks)


def grafted_each(xp, started, directions, grafting) -> list:
    """:func:`grafted` of each parameter's direction as one block, those of one shape
    and dtype stacked (one rescaling for all of a model's same-size biases)."""
    if isinstance(started, bool) and not started:
        return list(grafting)
    kinds: dict = {}
    for j, d in enumerate(directions):
        kinds.setdefault((tuple(d.shape), d.dtype), []).append(j)
    out: list = [None] * len(directions)
    for members in kinds.values():
        done = grafted(xp, started, xp.stack([directions[j] for j in members]),
                       xp.stack([grafting[j] for j in members]))
        for r, j in enumerate(members):
            out[j] = done[r, ...]
    return out


def update(grads, state: SOAPState, params, config: SOAPConfig, *, lr=None, weight_decay=None,
           check_grads: bool = True, in_place: bool = False, refresh=None, finite=None):
    """One SOAP step: the updates to add to the parameters, and the advanced state.

    Parameters
    ----------
    grads : sequence of arrays or None
        One per parameter; None leaves a parameter, its moments and factors as they
        are (a refresh still renews its bases from those factors, rotating its moments).
    state : SOAPState
        From :func:`init` or a previous ``update``; untouched unless ``in_place``.
    params : sequence of arrays or None
        The current parameters (for weight decay); None when it is 0 everywhere.
    config : SOAPConfig
    lr, weight_decay : float or sequence of float, optional
        Per-parameter overrides of ``config.lr`` / ``config.weight_decay``.
    check_grads : bool
        Apply ``config.nonfinite_grads`` on the host (one read per step).
    in_place : bool
        Overwrite the state's moments and factors (NumPy, CuPy, PyTorch).
    refresh : bool or 0-d boolean array, optional
        Whether this step refreshes the bases, decided by the caller from a host-side
        count; default ``config.refreshes_at(step)``.
    finite : 0-d boolean array, optional
        Whether every gradient is finite, on the device (:func:`all_finite`): where
        False the step is skipped without a host read (``check_grads=False``).

    Returns
    -------
    updates : list of arrays or None
    state : SOAPState

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim.soap import SOAPConfig, init, update
    >>> config = SOAPConfig(lr=0.1, precondition_frequency=2)
    >>> w = np.ones((3, 2))
    >>> state = init([w], config)
    >>> for _ in range(3):
    ...     updates, state = update([2 * w], state, [w], config)
    ...     w = w + updates[0]
    >>> state.step, state.refreshes, bool(np.all(w < 1))
    (3, 2, True)
    """
    plan = state.plan
    grads = check_gradients(grads, plan)
    count = len(plan.params)
    present_arrays = [g for g in grads if g is not None]
    if not present_arrays:
        return [None] * count, state
    xp = _xp.array_namespace(*present_arrays)
    lrs = _per_param(lr, config.lr, count, "lr")
    decays = _per_param(weight_decay, config.weight_decay, count, "weight_decay")
    if params is None and any(decays):
        raise ValueError(DECAY_NEEDS_PARAMS)
    params = [None] * count if params is None else list(params)
    if check_grads:
        skipped = screen(xp, grads, state, config)
        if skipped is not None:
            return skipped
    taken = finite
    overwrite = in_place and _xp.backend_name(xp) != "jax"
    adam = config.adam
    present = [g is not None for g in grads]
    step = advance(xp, state.step, taken, in_place=overwrite)
    this_step, param_steps = advance_param_steps(xp, state.param_steps, present, taken,
                                                 in_place=overwrite)
    schedule = Schedule(config.refreshes_at(step) if refresh is None else refresh, True)

    indices = [i for i in range(count) if present[i]]
    gs = [xp.astype(grads[i], compute_dtype(xp, grads[i]), copy=False) for i in indices]
    if taken is not None:   # a skipped step's NaN must not reach a product
        gs = lists.zero_unless(xp, taken, gs)
    effective: list = [None] * count
    for i, g in zip(indices, effective_gradients(xp, gs, [params[i] for i in indices],
                                                 [decays[i] for i in indices], adam)):
        effective[i] = g
    views = [None if g is None else xp.reshape(g, layout.view)
             for g, layout in zip(effective, plan.params)]
    runs = _runs(plan, present)
    gathered = [gather_blocks(run, views, xp) for _, _, _, run in runs]
    # Adam, in one list operation per term for every unfactored parameter and every run.
    flat = [i for i in indices if plan.params[i].kind == "elementwise"]
    sides = [side_slots(state.bases, run) for _, _, _, run in runs]
    rotated = [to_eigenbasis(xp, blocks, *qs) for blocks, qs in zip(gathered, sides)]
    steps = [this_step[i] for i in flat] + [_run_step(xp, this_step, run, blocks)
                                            for (_, _, _, run), blocks in zip(runs, rotated)]
    new_m, new_v, m_hats, directions = grafting_directions(
        xp, [effective[i] for i in flat] + rotated,
        step_moments(state.exp_avg, state.block_exp_avg, flat, runs),
        step_moments(state.exp_avg_sq, state.block_exp_avg_sq, flat, runs),
        steps, adam, in_place=in_place, step_taken=taken)
    exp_avg, block_m = put_step_moments(state.exp_avg, state.block_exp_avg, flat, runs, new_m,
                                        in_place=in_place)
    exp_avg_sq, block_v = put_step_moments(state.exp_avg_sq, state.block_exp_avg_sq, flat,
                                           runs, new_v, in_place=in_place)
    offset = len(flat)
    grafting_fields: dict = {}
    started, grafting = False, []
    if config.grafting != "none":
        check_grafting_state(state, config)
        started = config.grafting_started(step)
        if config.keeps_grafting_moments:     # blocks' in the parameter's basis
            grafting_fields, grafting = advance_grafting(
                xp, state, config, flat, runs, [effective[i] for i in flat] + gathered, steps,
                in_place=in_place, step_taken=taken)
        else:                                 # sgd: m̂, blocks' in their eigenbasis
            grafting = m_hats
            directions = directions[:offset] + [grafted(xp, started, d, a) for d, a in zip(
                directions[offset:], m_hats[offset:])]
        directions = grafted_each(xp, started, directions[:offset], grafting[:offset]) \
            + directions[offset:]
    out: list = [None] * count
    for j, i in enumerate(flat):
        out[i] = directions[j]
    back = [from_eigenbasis(xp, d, *qs) for d, qs in zip(directions[offset:], sides)]
    if config.keeps_grafting_moments:
        back = [grafted(xp, started, d, a) for d, a in zip(back, grafting[offset:])]
    written = write_blocks(xp, plan, [run for _, _, _, run in runs], back, views)
    for i, layout in enumerate(plan.params):
        if written[i] is not None:
            out[i] = xp.reshape(written[i], layout.shape)
    updates_present, _ = final_updates(
        xp, [out[i] for i in indices], [None] * len(indices), [params[i] for i in indices],
        [lrs[i] for i in indices], [decays[i] for i in indices], adam, in_place=in_place,
        step_taken=taken)
    updates: list = [None] * count
    for i, u in zip(indices, updates_present):
        updates[i] = u

    # The factors take this step's gradients after the step, and a refreshed basis
    # serves from the next step on (SOAP's order): a basis made with the gradient it
    # then rotates would show that gradient nearly diagonal, and Adam would blow its
    # rounding noise off the diagonal up to ±1 entries.
    factors = list(state.factors)
    for (_, _, _, run), blocks in zip(runs, gathered):
        factors = accumulate_factors(xp, run, blocks, factors, config.factor_beta,
                                     in_place=in_place, step_taken=taken)

    def refreshed(bases, residuals, block_m, block_v):
        return refresh_bases(xp, plan, config, factors, bases, residuals, block_m, block_v)

    def kept(*operands):
        return tuple(list(o) for o in operands)

    bases, residuals, block_m, block_v = schedule.branch(
        schedule.refresh, refreshed, kept, state.bases, state.residuals, block_m, block_v) \
        if plan.stacks else kept(state.bases, state.residuals, block_m, block_v)
    refreshes = schedule.counted(xp, state.refreshes, schedule.refresh, in_place=overwrite)
    skipped = state.skipped_steps
    if taken is not None:
        skipped = advance(xp, skipped, ~taken, in_place=overwrite)
    return updates, state._replace(
        step=step, param_steps=param_steps, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq,
        block_exp_avg=block_m, block_exp_avg_sq=block_v, factors=factors, bases=bases,
        residuals=residuals, refreshes=refreshes, skipped_steps=skipped, **grafting_fields)


def soap(**hyperparameters) -> GradientTransformation:
    """An optax-style ``(init, update)`` pair for fixed hyperparameters (any array library).

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim.soap import soap
    >>> opt = soap(lr=0.05, precondition_frequency=2, weight_decay=0.0)
    >>> params = [np.ones((4, 3)), np.zeros(3)]
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...     updates, state = opt.update([2 * params[0], params[1] - 1], state, params)
    ...     params = [p + u for p, u in zip(params, updates)]
    >>> bool(np.all(params[0] < 1)), state.refreshes
    (True, 2)
    """
    check_soap_keywords(hyperparameters, "soap")
    config = SOAPConfig(**hyperparameters)
    return GradientTransformation(lambda params: init(params, config),
                                  lambda grads, state, params=None:
                                  update(grads, state, params, config))
