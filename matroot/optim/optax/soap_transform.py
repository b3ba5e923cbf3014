"""``matroot.optim.optax.soap``: stacked SOAP as an optax ``GradientTransformation``.

A thin shell over the functional core (:func:`matroot.optim.soap.update`), as
:mod:`.shampoo_transform` is over Shampoo's: the leaves of any pytree of
``jax.Array`` are planned into blocks once (from their shapes), each size's
eigenbases in the whole pytree are refreshed by one :func:`matroot.refresh_eigenbasis`
call, the state is a NamedTuple of arrays, the update is ``jax.jit``-able (the refresh
is a ``lax.cond`` on the step count), and the learning rate is
``optax.scale_by_learning_rate``'s (a float or any schedule).
"""

from __future__ import annotations

import optax

from ... import _xp
from ..soap import core
from ..soap.config import FIELDS, SOAPConfig, check_soap_keywords
from ..soap.state import SOAPState, init, make_plan
from .block_core import block_core_transform, split_traced_decay
from .keywords import host_values, with_keywords

__all__ = ["soap", "scale_by_soap", "SOAPOptaxState"]

#: The optax state is the core's :class:`~matroot.optim.soap.SOAPState`, a JAX pytree
#: here (its block plan static), its counters int32 arrays.
SOAPOptaxState = SOAPState
_xp.register_jax_pytree(SOAPState, ("plan",))


def scale_by_soap(**hyperparameters) -> optax.GradientTransformation:
    """The SOAP direction ``+(D + weight_decay·param)``, without the learning rate.

    Parameters
    ----------
    **hyperparameters
        Any :class:`~matroot.optim.soap.SOAPConfig` field except ``lr``; the defaults
        are the config's (the torch optimizer's too).

    Returns
    -------
    optax.GradientTransformation
    """
    hyperparameters = host_values("scale_by_soap", hyperparameters,
                                  traced_ok=("weight_decay",))
    if "lr" in hyperparameters:
        raise ValueError("scale_by_soap takes no lr: chain it with "
                         "optax.scale_by_learning_rate (matroot.optim.optax.soap does)")
    check_soap_keywords(hyperparameters, "scale_by_soap")
    # An injected (traced) decoupled decay is added by the shell, as Shampoo's is.
    hyperparameters, traced_decay = split_traced_decay("soap", hyperparameters)
    return block_core_transform(
        "soap", SOAPConfig(lr=1.0, **hyperparameters), make_plan=make_plan, init=init,
        update=core.update, counters=("step", "refreshes", "skipped_steps"),
        traced_decay=traced_decay)


def soap(learning_rate, **hyperparameters) -> optax.GradientTransformation:
    """Stacked SOAP for optax: ``scale_by_soap`` then the learning rate.

    Parameters
    ----------
    learning_rate : float or optax schedule
    **hyperparameters
        Any :class:`~matroot.optim.soap.SOAPConfig` field except ``lr``.

    Returns
    -------
    optax.GradientTransformation
        ``update`` needs ``params`` when ``weight_decay > 0`` (the default).

    Examples
    --------
    >>> import jax, jax.numpy as jnp, optax
    >>> from matroot.optim.optax import soap
    >>> params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    >>> opt = soap(0.1, precondition_frequency=2)
    >>> state = opt.init(params)
    >>> loss = lambda p: jnp.sum((p["w"] - 2.0) ** 2) + jnp.sum(p["b"] ** 2)
    >>> @jax.jit
    ... def step(params, state):
    ...     updates, state = opt.update(jax.grad(loss)(params), state, params)
    ...     return optax.apply_updates(params, updates), state
    >>> for _ in range(5):
    ...     params, state = step(params, state)
    >>> bool(loss(params) < 12.0), int(state[0].refreshes)
    (True, 3)
    """
    return optax.chain(scale_by_soap(**host_values("soap", hyperparameters,
                                                   traced_ok=("weight_decay",))),
                       optax.scale_by_learning_rate(learning_rate))


_KEYWORDS = [name for name in FIELDS if name != "lr"]
with_keywords(scale_by_soap, _KEYWORDS)
with_keywords(soap, _KEYWORDS)
