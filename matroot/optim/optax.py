"""``matroot.optim.optax.shampoo``: stacked-block Shampoo as an optax ``GradientTransformation``.

A thin shell over the functional core (:func:`matroot.optim.update`): parameters
are any pytree of ``jax.Array``; their leaves are planned into blocks once (from
the shapes), every same-size factor of the whole pytree sits in one stack and
gets its inverse roots from one :func:`matroot.inv_root` call per size. The
state is a NamedTuple of arrays (checkpoint it with any pytree tool), the
update is ``jax.jit``-able (root refreshes are a ``lax.cond`` on the step count),
and the learning rate is applied by ``optax.scale_by_learning_rate``, so a float
or any optax schedule works.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from . import core
from .muon_optax import MuonOptaxState, muon, scale_by_muon  # noqa: F401  (re-export)

__all__ = ["shampoo", "scale_by_shampoo", "ShampooOptaxState"]


class ShampooOptaxState(NamedTuple):
    """The core's :class:`~matroot.optim.ShampooState` as arrays (a pytree).

    ``count`` and ``param_counts`` are int32 step counters (all steps, and per
    leaf); the lists follow the pytree's leaves and the plan's stacks (entries
    are None where a setting keeps no array, e.g. ``momentum`` without momentum).
    ``factor_bounds`` carries each factor's λmax bound between refreshes
    (:mod:`matroot.optim.factor_bounds`; None in a state saved before it existed).
    """

    count: Any
    param_counts: Any
    exp_avg: list
    exp_avg_sq: list
    factors: list
    roots: list
    root_failures: list
    root_refreshes: Any
    momentum: list
    factor_bounds: list | None = None


def scale_by_shampoo(**hyperparameters) -> optax.GradientTransformation:
    """The Shampoo direction ``+(d + weight_decay·param)``, without the learning rate.

    Parameters
    ----------
    **hyperparameters
        Any :class:`~matroot.optim.ShampooConfig` field except ``lr``; the
        defaults are the config's (the same as the torch optimizer's).

    Returns
    -------
    optax.GradientTransformation
    """
    if "lr" in hyperparameters:
        raise ValueError("scale_by_shampoo takes no lr: chain it with "
                         "optax.scale_by_learning_rate (matroot.optim.optax.shampoo does)")
    config = core.ShampooConfig(lr=1.0, **hyperparameters)
    plans: dict = {}

    def plan_of(leaves):
        """The block plan of these leaves' shapes and dtypes (static under jit)."""
        key = tuple((tuple(x.shape), jnp.dtype(x.dtype)) for x in leaves)
        if key not in plans:
            plans[key] = core.make_plan(leaves, config)
        return plans[key]

    def build_state(leaves):
        state = core.init(leaves, config, plan=plan_of(leaves))
        return ShampooOptaxState(
            count=jnp.zeros((), jnp.int32),
            param_counts=jnp.zeros((len(leaves),), jnp.int32),
            exp_avg=state.exp_avg, exp_avg_sq=state.exp_avg_sq, factors=state.factors,
            roots=state.roots, root_failures=state.root_failures,
            root_refreshes=jnp.zeros((), jnp.int32), momentum=state.momentum_buffer,
            factor_bounds=state.factor_bounds)

    def init_fn(params):
        leaves = jax.tree_util.tree_leaves(params)
        # Every array of the state is committed to a device, or none is, as the params
        # are: jax.jit keys its cache on it, so a mix compiles the step a second time
        # once the first step's outputs come back committed. A jitted init's outputs
        # depend on no input's values, so they are uncommitted.
        state = jax.jit(build_state)(leaves)
        committed = [leaf for leaf in leaves if getattr(leaf, "committed", False)]
        if committed and len(committed[0].sharding.device_set) == 1:
            state = jax.device_put(state, next(iter(committed[0].sharding.device_set)))
        return state

    def update_fn(updates, state, params=None):
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        param_leaves = None if params is None else jax.tree_util.tree_leaves(params)
        core_state = core.ShampooState(
            step=state.count, param_steps=tuple(state.param_counts[i] for i in range(len(leaves))),
            exp_avg=state.exp_avg, exp_avg_sq=state.exp_avg_sq, factors=state.factors,
            roots=state.roots, root_failures=state.root_failures,
            root_refreshes=state.root_refreshes, skipped_steps=0,
            plan=plan_of(leaves), momentum_buffer=state.momentum,
            factor_bounds=state.factor_bounds)
        # lr = 1 gives −(d + weight_decay·param); optax's sign convention wants +.
        directions, new = core.update(leaves, core_state, param_leaves, config,
                                      check_grads=False)
        new_state = ShampooOptaxState(
            count=new.step, param_counts=jnp.stack(new.param_steps),
            exp_avg=new.exp_avg, exp_avg_sq=new.exp_avg_sq, factors=new.factors,
            roots=new.roots, root_failures=new.root_failures,
            root_refreshes=new.root_refreshes, momentum=new.momentum_buffer,
            factor_bounds=new.factor_bounds)
        return treedef.unflatten([-d for d in directions]), new_state

    return optax.GradientTransformation(init_fn, update_fn)


def shampoo(learning_rate, **hyperparameters) -> optax.GradientTransformation:
    """Stacked-block Shampoo for optax: ``scale_by_shampoo`` then the learning rate.

    Parameters
    ----------
    learning_rate : float or optax schedule
        Step size (a callable of the step count for schedules).
    **hyperparameters
        Any :class:`~matroot.optim.ShampooConfig` field except ``lr`` (betas,
        eps, weight_decay, block_size, precondition_frequency, root_method, ...),
        with the config's defaults, the torch optimizer's too.

    Returns
    -------
    optax.GradientTransformation
        ``update`` needs ``params`` when ``weight_decay > 0`` (the default).

    Examples
    --------
    >>> import jax, jax.numpy as jnp, optax
    >>> from matroot.optim.optax import shampoo
    >>> params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    >>> opt = optax.chain(optax.clip_by_global_norm(1.0),
    ...                   shampoo(0.1, precondition_frequency=2, root_method="newton_db"))
    >>> state = opt.init(params)
    >>> loss = lambda p: jnp.sum((p["w"] - 2.0) ** 2) + jnp.sum(p["b"] ** 2)
    >>> @jax.jit
    ... def step(params, state):
    ...     updates, state = opt.update(jax.grad(loss)(params), state, params)
    ...     return optax.apply_updates(params, updates), state
    >>> for _ in range(5):
    ...     params, state = step(params, state)
    >>> bool(loss(params) < 12.0), int(state[1][0].root_refreshes)
    (True, 2)
    """
    return optax.chain(scale_by_shampoo(**hyperparameters),
                       optax.scale_by_learning_rate(learning_rate))
