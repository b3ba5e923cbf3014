"""SOAP's grafting (``SOAPConfig.grafting``): each block's step length from another method.

Distributed Shampoo's rule for its ``grafting_config``, with Shampoo's math
(:mod:`matroot.optim.shampoo_core.grafting`: :func:`grafting_directions` for the
grafting direction ``a``, :func:`graft` for the rescaling, one place for both):

- from ``start_preconditioning_step`` on, each block's SOAP direction ``D`` becomes
  ``‖a‖_F/‖D‖_F · D`` (per block of a factored parameter, per parameter without
  factors); before it the step is ``a`` itself;
- ``a`` is the bias-corrected first moment ``m̂`` for "sgd" (SOAP's own: a block's, kept
  in its eigenbasis, has the norm of the parameter-basis ``m̂``, the bases being
  orthonormal, so it is grafted there and costs no state), and ``m̂/(√v̂ + eps)`` from
  moments of its own, kept in the parameter's basis and advanced with the effective
  gradient, for "adam" (bias-corrected ``v``), "rmsprop" (not) and "adagrad"
  (``v`` a running sum).
"""

from __future__ import annotations

from ..shampoo_core.grafting import graft, grafting_directions
from .config import SOAPConfig
from .state import SOAPState, put_step_moments, step_moments

__all__ = ["check_grafting_state", "advance_grafting", "grafted", "grafted_each"]


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
    new_m, new_v, _, directions = grafting_directions(
        xp, gradients,
        step_moments(state.graft_exp_avg, state.block_graft_exp_avg, flat, runs),
        step_moments(state.graft_exp_avg_sq, state.block_graft_exp_avg_sq, flat, runs),
        steps, config.grafting_method, in_place=in_place, step_taken=step_taken)
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
    """:func:`grafted` of each parameter's direction as one block."""
    if isinstance(started, bool) and not started:
        return list(grafting)
    return [grafted(xp, started, d[None, ...], a[None, ...])[0, ...]
            for d, a in zip(directions, grafting)]
