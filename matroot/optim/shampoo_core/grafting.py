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

import numpy as np

from ... import _xp
from .config import ShampooConfig
from .preconditioner import assign

__all__ = ["effective_gradient", "grafting_direction", "final_update", "block_norms", "graft"]


def effective_gradient(xp, grad, param, weight_decay: float, config: ShampooConfig):
    """The gradient the moments and factors see: sign for ``maximize``, L2 term added."""
    if config.maximize:
        grad = -grad
    if config.weight_decay_type == "l2" and weight_decay:
        grad = grad + weight_decay * xp.astype(param, grad.dtype, copy=False)
    return grad


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
    step_taken : 0-d boolean array, optional
        Where False the moments keep their values (a step skipped on the device).

    Returns
    -------
    exp_avg, exp_avg_sq, m_hat, direction : arrays (``exp_avg_sq`` None for sgd)
    """
    beta1 = config.betas[0]
    # Overwriting the moments with in-place operators makes one temporary where the
    # expressions make three and a copy (fresh allocations dominate these passes on a
    # CPU); the arithmetic, and so the rounding, is the same in both forms.
    overwrite = in_place and step_taken is None and _xp.backend_name(xp) != "jax"
    if overwrite:
        change = grad - exp_avg
        change *= 1.0 - beta1
        exp_avg += change
    else:
        exp_avg = assign(exp_avg, ..., exp_avg + (1.0 - beta1) * (grad - exp_avg),
                         in_place=in_place, step_taken=step_taken)
    corr1 = 1.0 - beta1 ** step if config.bias_correction else 1.0
    first = beta1 * exp_avg + (1.0 - beta1) * grad if config.nesterov else exp_avg
    m_hat = first / corr1
    beta2 = config.second_moment_beta
    if beta2 is None:
        return exp_avg, exp_avg_sq, m_hat, m_hat
    square = grad * grad
    if overwrite:
        if beta2 != 1.0:
            exp_avg_sq *= beta2
            square *= 1.0 - beta2
        exp_avg_sq += square
    else:
        advanced = exp_avg_sq + square if beta2 == 1.0 else \
            beta2 * exp_avg_sq + (1.0 - beta2) * square
        exp_avg_sq = assign(exp_avg_sq, ..., advanced, in_place=in_place, step_taken=step_taken)
    corrected = config.grafting == "adam" and config.bias_correction and beta2 < 1.0
    corr2 = 1.0 - beta2 ** step if corrected else 1.0
    denominator = xp.sqrt(exp_avg_sq)
    denominator /= corr2 ** 0.5
    denominator += config.eps
    return exp_avg, exp_avg_sq, m_hat, m_hat / denominator


def final_update(xp, direction, momentum_buffer, param, lr: float, weight_decay: float,
                 config: ShampooConfig, *, in_place: bool = True, step_taken=None):
    """``(−lr·(u + wd·param), momentum_buffer)``; the buffer (None without momentum)
    is advanced, in place when ``in_place``, only where ``step_taken`` holds when given."""
    if momentum_buffer is not None:
        momentum_buffer = assign(momentum_buffer, ..., config.momentum * momentum_buffer
                                 + direction, in_place=in_place, step_taken=step_taken)
        direction = momentum_buffer
    update = -lr * direction
    if config.weight_decay_type == "decoupled" and weight_decay:
        update = update - (lr * weight_decay) * xp.astype(param, direction.dtype, copy=False)
    return update, momentum_buffer


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
    norms = block_norms(directions)
    finite = xp.isfinite(norms)
    usable = finite & (norms > 0)
    scale = xp.where(usable, block_norms(adam_directions) / xp.where(usable, norms,
                                                                    xp.ones_like(norms)),
                     xp.zeros_like(norms))
    expand = (slice(None),) + (None,) * (directions.ndim - 1)
    grafted = directions * scale[expand]
    return xp.where(finite[expand], grafted, adam_directions)
