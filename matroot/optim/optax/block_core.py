"""The optax shell of a stacked-block functional core (Shampoo's and SOAP's).

Both cores plan a pytree's leaves into blocks from their shapes, keep a NamedTuple
state of arrays, and return the direction ``−(D + weight_decay·param)`` with lr = 1.
:func:`block_core_transform` is what an optax ``GradientTransformation`` adds around
either: a plan per set of leaf shapes (static under ``jax.jit``), a jitted ``init``
whose counters are int32 arrays placed as the parameters are, the check that an
update fits the state, NaN/Inf gradients screened on the device, and optax's sign
and dtype conventions for the updates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from ... import _xp
from ..shampoo_core.core import DECAY_NEEDS_PARAMS
from ..shampoo_core.gradients import all_finite
from .leaves import check_leaves_fit

__all__ = ["block_core_transform", "split_traced_decay"]


def split_traced_decay(name: str, hyperparameters: dict) -> tuple[dict, Any]:
    """``(hyperparameters, traced_decay)``: a decoupled ``weight_decay`` that is traced
    (``optax.inject_hyperparams`` under ``jax.jit``, a decay schedule) taken out of the
    config's keywords (there 0) for :func:`block_core_transform` to add; ``None`` where
    the decay is a Python number.

    Raises
    ------
    TypeError
        A traced decay with ``weight_decay_type="l2"`` (added to the gradient, inside
        the preconditioner: it must be static).
    """
    decay = hyperparameters.get("weight_decay")
    if not _xp.is_traced(decay):
        return hyperparameters, None
    if hyperparameters.get("weight_decay_type", "decoupled") != "decoupled":
        raise TypeError("an injected weight_decay is added outside the preconditioner, so "
                        "it needs weight_decay_type='decoupled'; with 'l2' name it in "
                        f"inject_hyperparams({name}, static_args=('weight_decay',))")
    return {**hyperparameters, "weight_decay": 0.0}, decay


def block_core_transform(name: str, config: Any, *, make_plan: Callable, init: Callable,
                         update: Callable, counters: Sequence[str],
                         traced_decay: Any = None) -> optax.GradientTransformation:
    """The optax transformation ``+(D + weight_decay·param)`` of a stacked-block core.

    Parameters
    ----------
    name : str
        The optimizer's name, for error messages.
    config : dataclass
        The core's config, with ``lr = 1`` and ``nonfinite_grads``.
    make_plan, init, update : callable
        The core's ``make_plan(leaves, config)``, ``init(leaves, config, plan=)`` and
        ``update(grads, state, params, config, check_grads=, finite=)``.
    counters : sequence of str
        The state's scalar counters (``step`` among them), made int32 arrays by ``init``;
        ``param_steps`` holds one per leaf.
    traced_decay : jax.Array, optional
        A decoupled weight decay known only under ``jax.jit`` (``optax.inject_hyperparams``),
        added to the core's direction where the step was taken; the config's decay is
        then 0.

    Returns
    -------
    optax.GradientTransformation

    Examples
    --------
    >>> import jax.numpy as jnp
    >>> from matroot.optim.soap import SOAPConfig, update
    >>> from matroot.optim.soap.state import init, make_plan
    >>> opt = block_core_transform("soap", SOAPConfig(lr=1.0, weight_decay=0.0),
    ...                            make_plan=make_plan, init=init, update=update,
    ...                            counters=("step", "refreshes", "skipped_steps"))
    >>> params = {"w": jnp.ones((4, 3))}
    >>> updates, state = opt.update({"w": jnp.ones((4, 3))}, opt.init(params), params)
    >>> updates["w"].shape, int(state.step)
    ((4, 3), 1)
    """
    plans: dict = {}

    def plan_of(leaves):
        """The block plan of these leaves' shapes and dtypes (static under jit)."""
        key = tuple((tuple(x.shape), jnp.dtype(x.dtype)) for x in leaves)
        if key not in plans:
            plans[key] = make_plan(leaves, config)
        return plans[key]

    def build_state(leaves):
        state = init(leaves, config, plan=plan_of(leaves))
        counter = jnp.zeros((), jnp.int32)
        return state._replace(param_steps=(counter,) * len(leaves),
                              **{field: counter for field in counters})

    def init_fn(params):
        leaves = jax.tree_util.tree_leaves(params)
        if not leaves:      # nothing to optimize (optax.masked with every leaf masked)
            return optax.EmptyState()
        # Every array of the state is committed to a device, or none is, as the params
        # are: jax.jit keys its cache on it, so a mix compiles the step a second time
        # once the first step's outputs come back committed. A jitted init's outputs
        # depend on no input's values, so they are uncommitted. Traced params (init under
        # jax.jit, jax.eval_shape, jax.vmap) have no placement to follow: reading it raises.
        state = jax.jit(build_state)(leaves)
        committed = [leaf for leaf in leaves
                     if not _xp.is_traced(leaf) and getattr(leaf, "committed", False)]
        if committed and len(committed[0].sharding.device_set) == 1:
            state = jax.device_put(state, next(iter(committed[0].sharding.device_set)))
        return state

    def update_fn(updates, state, params=None):
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        if not leaves:
            return updates, state
        check_leaves_fit(updates, [layout.shape for layout in state.plan.params], name)
        # A state restored from a checkpoint may hold NumPy arrays (flax.serialization).
        state = jax.tree_util.tree_map(jnp.asarray, state)
        param_leaves = None if params is None else jax.tree_util.tree_leaves(params)
        # A traced step cannot raise, so there NaN/Inf gradients skip the step on the
        # device (counted in skipped_steps) whatever the policy; eagerly "raise" raises.
        # Whether this runs traced shows in the flag itself, not in the inputs: a branch
        # of an eager optax.apply_if_finite's lax.cond closes over concrete gradients
        # and state, and so does a scan body over constant gradients.
        finite = all_finite(leaves)
        raises = config.nonfinite_grads == "raise" and not _xp.is_traced(finite)
        step_before = state.step
        # lr = 1 gives −(D + weight_decay·param); optax's sign convention wants +.
        directions, state = update(leaves, state, param_leaves, config, check_grads=raises,
                                   finite=None if raises else finite)
        directions = [-d for d in directions]
        if traced_decay is not None:
            if param_leaves is None:
                raise ValueError(DECAY_NEEDS_PARAMS)
            # A skipped step (NaN/Inf gradients) stays a zero update.
            taken = state.step != step_before
            directions = [d + jnp.where(taken, traced_decay, 0.0) * p.astype(d.dtype)
                          for d, p in zip(directions, param_leaves)]
        # Updates in the gradients' dtypes, as optax's transforms give them: a bfloat16
        # model's hand-written `p + u` stays bfloat16 (the cores compute in float32).
        return treedef.unflatten([d.astype(g.dtype) for d, g in zip(directions, leaves)]), state

    return optax.GradientTransformation(init_fn, update_fn)
