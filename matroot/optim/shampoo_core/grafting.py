"""The elementwise half of a Shampoo step: moments, grafting directions, the final update.

Each function works on one parameter's arrays through the array API. The
definitions (``t`` is the parameter's step, ``m``/``v`` its moments):

- gradient: ``g ← −g`` when maximizing, then ``g ← g + wd·param`` for L2 weight decay;
- first moment ``m ← β₁m + (1−β₁)g``; ``m̂ = m/(1−β₁ᵗ)`` (``β₁m + (1−β₁)g`` in place of
  ``m`` with Nesterov);
- grafting direction: ``m̂/(√v̂ + eps)`` with ``v ← β₂'v + (1−β₂')g²`` and
  ``v̂ = v/(1−β₂'ᵗ)`` (adam), ``m̂/(√v + eps)`` with ``v ← v + g²`` (adagrad) or the EMA
  without bias correction (rmsprop), or ``m̂`` itself (sgd);
- final update: ``u ← μu + d`` when ``momentum = μ > 0``, then ``−lr·(d + wd·param)``
  (decoupled weight decay) or ``−lr·d`` (L2);
- grafting (:func:`graft`): each block's Shampoo direction rescaled to the Frobenius
  norm (:func:`block_norms`) of its grafting direction.
"""

from __future__ import annotations

import contextlib
import numbers

import numpy as np

from ... import _xp
from . import lists
from .config import ShampooConfig
from .skipping import skip_coefficients

__all__ = ["effective_gradient", "effective_gradients", "grafting_direction",
           "grafting_directions", "final_update", "final_updates", "block_norms", "graft"]


def effective_gradient(xp, grad, param, weight_decay: float, config: ShampooConfig):
    """The gradient the moments and factors see: sign for ``maximize``, L2 term added."""
    return effective_gradients(xp, [grad], [param], [weight_decay], config)[0]


def effective_gradients(xp, grads, params, decays, config: ShampooConfig) -> list:
    """:func:`effective_gradient` of every entry, one list operation per term."""
    grads = list(grads)
    if config.maximize:
        grads = lists.neg(xp, grads)
    if config.weight_decay_type == "l2":
        decayed = [i for i, d in enumerate(decays) if d]
        terms = lists.mul(xp, [xp.astype(params[i], grads[i].dtype, copy=False)
                               for i in decayed], [decays[i] for i in decayed])
        for i, g in zip(decayed, lists.add(xp, [grads[i] for i in decayed], terms)):
            grads[i] = g
    return grads


def _steps(xp, steps):
    """One step count shared by every entry (the same object or an equal int), or the
    list of them."""
    steps = list(steps)
    first = steps[0]
    if all(s is first for s in steps) or (
            isinstance(first, int) and all(isinstance(s, int) and s == first for s in steps)):
        return first
    return steps


def _corrections(xp, beta: float, steps):
    """``1 − βᵗ`` for one step count or a list of them (ints or 0-d arrays)."""
    if not isinstance(steps, list):
        return 1.0 - _xp.power_of_count(beta, steps)
    if all(isinstance(t, numbers.Integral) for t in steps):
        return [1.0 - beta ** t for t in steps]
    return lists.add_(xp, lists.neg(xp, lists.pow_from(xp, beta, steps)), 1.0)


def _root_of(xp, corrections):
    if isinstance(corrections, list):
        if corrections and not isinstance(corrections[0], numbers.Real):
            return lists.sqrt(xp, corrections)
        return [c ** 0.5 for c in corrections]
    return corrections ** 0.5


def grafting_direction(xp, grad, exp_avg, exp_avg_sq, step, config: ShampooConfig, *,
                       in_place: bool = True, step_taken=None):
    """Advance the moments; return them with ``m̂`` and the grafting direction.

    Parameters
    ----------
    xp : namespace
    grad : array
        From :func:`effective_gradient`, in the moments' dtype.
    exp_avg : array
    exp_avg_sq : array or None
        None exactly when ``config.grafting == "sgd"``.
    step : int or 0-d integer array
        The parameter's 1-based step (for bias correction).
    config : ShampooConfig
    in_place : bool
        Overwrite the moments (NumPy, CuPy, PyTorch) rather than return new arrays.
    step_taken : 0-d boolean array or SkipCoefficients, optional
        Where False the moments keep their values (a step skipped on the device);
        ``grad`` must then be finite (:func:`matroot.optim.shampoo_core.lists.zero_unless`).

    Returns
    -------
    exp_avg, exp_avg_sq, m_hat, direction : arrays (``exp_avg_sq`` None for sgd)
    """
    out = grafting_directions(xp, [grad], [exp_avg], [exp_avg_sq], [step], config,
                              in_place=in_place, step_taken=step_taken)
    return tuple(column[0] for column in out)


def grafting_directions(xp, grads, exp_avgs, exp_avg_sqs, steps, config: ShampooConfig, *,
                        in_place: bool = True, step_taken=None) -> tuple:
    """:func:`grafting_direction` of every entry: one list operation per term, so the
    cost in operations does not grow with the number of entries.

    ``steps`` holds each entry's 1-based step; entries that share one step count (the
    same 0-d array object, or equal ints) get their bias corrections from one array.
    With ``step_taken`` the coefficients carry the selection
    (:mod:`matroot.optim.shampoo_core.skipping`, one select for all of them): ``1 − β₁``
    becomes 0 and ``β₂`` becomes 1 where the step is skipped, so the moments keep their
    exact values with no select per entry (the gradients must then be finite: the
    caller zeroes them where the step is skipped).

    Returns
    -------
    exp_avgs, exp_avg_sqs, m_hats, directions : lists (``exp_avg_sqs`` entries None for sgd)
    """
    grads, exp_avgs = list(grads), list(exp_avgs)
    exp_avg_sqs = list(exp_avg_sqs)
    if not grads:
        return [], [], [], []
    beta1 = config.betas[0]
    # Overwriting the moments with in-place operators makes one temporary where the
    # expressions make three and a copy (fresh allocations dominate these passes on a
    # CPU); the arithmetic, and so the rounding, is the same in both forms.
    overwrite = in_place and _xp.backend_name(xp) != "jax"
    rate1 = 1.0 - beta1
    skip = skip_coefficients(step_taken, config)
    coefficients = None if skip is None else skip.of(xp, grads[0].dtype)
    if coefficients is not None:
        rate1 = coefficients.rate1
    change = lists.sub(xp, grads, exp_avgs)
    if overwrite:
        change = lists.mul_(xp, change, rate1)
        exp_avgs = lists.add_(xp, exp_avgs, change)
    else:
        exp_avgs = lists.add(xp, exp_avgs, lists.mul(xp, change, rate1))
    steps = _steps(xp, steps)
    corr1 = _corrections(xp, beta1, steps) if config.bias_correction else 1.0
    first = lists.add(xp, lists.mul(xp, exp_avgs, beta1), lists.mul(xp, grads, rate1)) \
        if config.nesterov else exp_avgs
    m_hats = lists.div(xp, first, corr1)
    beta2 = config.second_moment_beta
    if beta2 is None:
        return exp_avgs, exp_avg_sqs, m_hats, m_hats
    squares = lists.mul(xp, grads, grads)
    # β₂ = 1 (adagrad) adds the squares unscaled; a skipped step scales them by 0
    # and the old sum by 1.
    decay = rate2 = None
    if beta2 != 1.0:
        decay, rate2 = beta2, 1.0 - beta2
    if coefficients is not None:
        rate2 = coefficients.rate2
        if decay is not None:
            decay = coefficients.decay2
    if overwrite:
        if decay is not None:
            exp_avg_sqs = lists.mul_(xp, exp_avg_sqs, decay)
        if rate2 is not None:
            squares = lists.mul_(xp, squares, rate2)
        exp_avg_sqs = lists.add_(xp, exp_avg_sqs, squares)
    else:
        kept = exp_avg_sqs if decay is None else lists.mul(xp, exp_avg_sqs, decay)
        exp_avg_sqs = lists.add(xp, kept, squares if rate2 is None
                                else lists.mul(xp, squares, rate2))
    corrected = config.grafting == "adam" and config.bias_correction and beta2 < 1.0
    corr2 = _corrections(xp, beta2, steps) if corrected else 1.0
    denominators = lists.sqrt(xp, exp_avg_sqs)
    if corrected:
        denominators = lists.div_(xp, denominators, _root_of(xp, corr2))
    denominators = lists.add_(xp, denominators, config.eps)
    return exp_avgs, exp_avg_sqs, m_hats, lists.div(xp, m_hats, denominators)


def final_update(xp, direction, momentum_buffer, param, lr: float, weight_decay: float,
                 config: ShampooConfig, *, in_place: bool = True, step_taken=None):
    """``(−lr·(u + wd·param), momentum_buffer)``; the buffer (None without momentum)
    is advanced, in place when ``in_place``, only where ``step_taken`` holds when given
    (then the update is zero: the step is skipped)."""
    updates, buffers = final_updates(xp, [direction], [momentum_buffer], [param], [lr],
                                     [weight_decay], config, in_place=in_place,
                                     step_taken=step_taken)
    return updates[0], buffers[0]


def final_updates(xp, directions, momentum_buffers, params, lrs, decays,
                  config: ShampooConfig, *, in_place: bool = True, step_taken=None) -> tuple:
    """:func:`final_update` of every entry, one list operation per term.

    ``directions`` must be finite where ``step_taken`` is given (a skipped step's
    update is the direction times zero).
    """
    directions, buffers = list(directions), list(momentum_buffers)
    if not directions:
        return [], buffers
    skip = skip_coefficients(step_taken, config)
    taken = None if skip is None else skip.of(xp, directions[0].dtype)
    if buffers[0] is not None:
        mu = config.momentum if taken is None else taken.momentum
        step_part = directions if taken is None else lists.mul(xp, directions, taken.taken)
        if in_place and _xp.backend_name(xp) != "jax":
            buffers = lists.mul_(xp, buffers, mu)
            buffers = lists.add_(xp, buffers, step_part)
        else:
            buffers = lists.add(xp, lists.mul(xp, buffers, mu), step_part)
        directions = buffers
    updates = lists.mul(xp, directions, [-lr for lr in lrs])
    if config.weight_decay_type == "decoupled":
        decayed = [i for i, d in enumerate(decays) if d]
        terms = lists.mul(xp, [xp.astype(params[i], directions[i].dtype, copy=False)
                               for i in decayed], [lrs[i] * decays[i] for i in decayed])
        subtracted = lists.sub(xp, [updates[i] for i in decayed], terms)
        for i, u in zip(decayed, subtracted):
            updates[i] = u
    if taken is not None:
        updates = lists.mul(xp, updates, taken.taken)
    return updates, buffers


#: A block norm at least this large, and finite, lost nothing to the squares' underflow
#: (float32: the terms that vanish are below 2^-149 each, 2^-25 of this squared even
#: for 2^24 of them) and did not overflow.
_SAFE_NORM = 2.0 ** -50
#: The powers of two a block whose plain norm was not safe is scaled by: a tiny block
#: up (entries below 2^-50 stay below 2^50), an overflowing one down (below 2^28).
_UP, _DOWN = 2.0 ** 100, 2.0 ** -100


def block_norms(blocks):
    """Frobenius norm of each block of a ``(k, ...)`` array, without overflow in the squares.

    The plain norm (one fused pass) is kept where it is finite and not tiny; elsewhere
    the norm is taken again of the block scaled by a power of two (exactly), so huge
    entries do not overflow and tiny ones do not vanish in their squares.

    Examples
    --------
    >>> import numpy as np
    >>> block_norms(np.array([[3e30, 4e30], [3e-30, 4e-30]], dtype=np.float32))
    array([5.e+30, 5.e-30], dtype=float32)
    """
    xp = _xp.array_namespace(blocks)
    wide = lists.frobenius_norms(xp, blocks)
    if wide is not None:
        return wide
    axes = tuple(range(1, blocks.ndim))
    # The plain pass may overflow or underflow by design (NumPy would warn): such
    # blocks are taken again below.
    quiet = np.errstate(over="ignore", under="ignore") if _xp.backend_name(xp) == "numpy" \
        else contextlib.nullcontext()
    with quiet:
        plain = xp.linalg.vector_norm(blocks, axis=axes)
    safe = (plain >= _SAFE_NORM) & (plain < xp.inf)
    one = xp.ones_like(plain)
    scale = xp.where(safe, one, xp.where(plain < _SAFE_NORM, _UP * one, _DOWN * one))
    expand = (slice(None),) + (None,) * (blocks.ndim - 1)
    rescaled = xp.linalg.vector_norm(blocks * scale[expand], axis=axes) / scale
    return xp.where(safe, plain, rescaled)


def graft(directions, adam_directions):
    """Rescale each block's Shampoo direction to the norm of its Adam direction.

    A zero Shampoo direction stays zero (its Adam direction is zero too, since
    both come from the same first moment); a block whose Shampoo direction is
    not finite takes its Adam direction instead.

    Parameters
    ----------
    directions, adam_directions : array, shape (k, ...)

    Returns
    -------
    array, shape (k, ...)
    """
    xp = _xp.array_namespace(directions)
    # Summed in float64 where the library can (one reduction each, no rescaling pass);
    # the scale is rounded to the blocks' dtype once.
    norms = lists.frobenius_norms(xp, directions, wide=True)
    adam_norms = None if norms is None else lists.frobenius_norms(xp, adam_directions, wide=True)
    if norms is None:
        norms, adam_norms = block_norms(directions), block_norms(adam_directions)
    usable = norms > 0          # False for NaN; +inf is caught by the last select
    # torch divides by zero quietly (the select drops those quotients); elsewhere the
    # zeros are replaced first, as NumPy would warn.
    ratio = adam_norms / (norms if lists.is_foreach(xp)
                          else xp.where(usable, norms, lists.constant(xp, 1.0, norms)))
    scale = xp.where(usable, ratio, lists.constant(xp, 0.0, norms))
    expand = (slice(None),) + (None,) * (directions.ndim - 1)
    grafted = directions * xp.astype(scale, directions.dtype, copy=False)[expand]
    # ``norms < inf`` is isfinite for a non-negative norm (NaN compares False), in one
    # operation where torch's isfinite takes four.
    return xp.where((norms < xp.inf)[expand], grafted, adam_directions)
