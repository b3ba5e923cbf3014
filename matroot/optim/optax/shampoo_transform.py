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

import optax

from ... import _xp
from ..shampoo_core import core
from ..shampoo_core.config import check_keywords
from .block_core import block_core_transform, split_traced_decay
from .keywords import host_values, with_keywords

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
    # A traced decay (optax.inject_hyperparams under jax.jit) is added outside the
    # config: decoupled, it is the same sum the core would form.
    hyperparameters, traced_decay = split_traced_decay("shampoo", hyperparameters)
    return block_core_transform(
        "shampoo", core.ShampooConfig(lr=1.0, **hyperparameters), make_plan=core.make_plan,
        init=core.init, update=core.update, counters=("step", "root_refreshes", "skipped_steps"),
        traced_decay=traced_decay)


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
