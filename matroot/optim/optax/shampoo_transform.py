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

import jax
import jax.numpy as jnp
import optax

from ... import _xp
from ..shampoo_core import core
from ..shampoo_core.config import check_keywords
from .keywords import host_values, with_keywords
from .leaves import check_leaves_fit

__all__ = ["shampoo", "scale_by_shampoo", "ShampooOptaxState"]


#: The optax state is the core's own :class:`~matroot.optim.shampoo_core.state.ShampooState`, a JAX
#: pytree here (its block plan static): counters ``step``, ``param_steps``,
#: ``root_refreshes`` and ``skipped_steps`` are int32 arrays, the lists follow the
#: pytree's leaves and the plan's stacks (None where a setting keeps no array).
ShampooOptaxState = core.ShampooState
_xp.register_jax_pytree(core.ShampooState, ("plan",))


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
    hyperparameters = host_values("scale_by_shampoo", hyperparameters,
                                  traced_ok=("weight_decay",))
    if "lr" in hyperparameters:
        raise ValueError("scale_by_shampoo takes no lr: chain it with "
                         "optax.scale_by_learning_rate (matroot.optim.optax.shampoo does)")
    check_keywords(hyperparameters, "scale_by_shampoo")
    # A traced decay (optax.inject_hyperparams under jax.jit) is added here, outside the
    # config: decoupled, it is the same sum the core would form.
    traced_decay = hyperparameters.get("weight_decay")
    if not _xp.is_traced(traced_decay):
        traced_decay = None
    elif hyperparameters.get("weight_decay_type", "decoupled") != "decoupled":
        raise TypeError("an injected weight_decay is added outside the preconditioner, so "
                        "it needs weight_decay_type='decoupled'; with 'l2' name it in "
                        "inject_hyperparams(..., static_args=('weight_decay',))")
    else:
        hyperparameters["weight_decay"] = 0.0
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
        counter = jnp.zeros((), jnp.int32)
        return state._replace(step=counter, param_steps=(counter,) * len(leaves),
                              root_refreshes=counter, skipped_steps=counter)

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
        check_leaves_fit(updates, [layout.shape for layout in state.plan.params], "shampoo")
        # A state restored from a checkpoint may hold NumPy arrays (flax.serialization).
        state = jax.tree_util.tree_map(jnp.asarray, state)
        param_leaves = None if params is None else jax.tree_util.tree_leaves(params)
        # A traced step cannot raise, so there NaN/Inf gradients skip the step on the
        # device (counted in skipped_steps) whatever the policy; eagerly "raise" raises.
        # Whether this runs traced shows in the flag itself, not in the inputs: a branch
        # of an eager optax.apply_if_finite's lax.cond closes over concrete gradients
        # and state, and so does a scan body over constant gradients.
        finite = core.all_finite(leaves)
        raises = config.nonfinite_grads == "raise" and not _xp.is_traced(finite)
        step_before = state.step
        # lr = 1 gives −(d + weight_decay·param); optax's sign convention wants +.
        directions, state = core.update(
            leaves, state, param_leaves, config, check_grads=raises,
            finite=None if raises else finite)
        directions = [-d for d in directions]
        if traced_decay is not None:
            if param_leaves is None:
                raise ValueError(core.DECAY_NEEDS_PARAMS)
            # A skipped step (NaN/Inf gradients) stays a zero update.
            taken = state.step != step_before
            directions = [d + jnp.where(taken, traced_decay, 0.0) * p.astype(d.dtype)
                          for d, p in zip(directions, param_leaves)]
        # Updates in the gradients' dtypes, as optax's transforms give them: a bfloat16
        # model's hand-written `p + u` stays bfloat16 (the core computes in float32).
        return treedef.unflatten([d.astype(g.dtype) for d, g in zip(directions, leaves)]), state

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
    return optax.chain(scale_by_shampoo(**host_values("shampoo", hyperparameters,
                                                     traced_ok=("weight_decay",))),
                       optax.scale_by_learning_rate(learning_rate))


#: The config's keywords, named in the factories' signatures for optax.inject_hyperparams.
_KEYWORDS = [name for name in core.ShampooConfig.__dataclass_fields__
             if core.ShampooConfig.__dataclass_fields__[name].init and name != "lr"]
with_keywords(scale_by_shampoo, _KEYWORDS)
with_keywords(shampoo, _KEYWORDS)
