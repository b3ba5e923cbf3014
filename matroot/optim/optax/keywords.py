"""Keyword signatures for the optax factories, so that ``optax.inject_hyperparams`` works.

``optax.inject_hyperparams(factory)`` binds its arguments to ``factory``'s signature
and calls ``factory`` again with every named argument: a factory that takes
``**hyperparameters`` receives ``hyperparameters={...}`` instead, and fails.
:func:`with_keywords` gives a factory a signature that names each config field
(keyword-only, defaulting to :data:`CONFIG_DEFAULT`, a marker that stands for the
config's own default: a numeric default would be turned into an injected array);
:func:`host_values` turns what the factory receives back into the config's keywords.

``inject_hyperparams`` turns every numeric argument into an array kept in its state.
Only the learning rate and the other values a factory applies as arrays may vary
under ``jax.jit``; the rest of a config decides the structure of the step (block
plan, schedule, solver) and must be a Python value there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from ... import _xp

__all__ = ["CONFIG_DEFAULT", "with_keywords", "host_values"]


class _ConfigDefault:
    """The marker default of a config keyword: the config's own default applies."""

    def __repr__(self) -> str:
        return "<config default>"


#: Stands for "the config's default" in a factory's signature.
CONFIG_DEFAULT: Any = _ConfigDefault()


def with_keywords(factory: Callable, names: Iterable[str]) -> Callable:
    """``factory`` with a signature whose ``**`` part is replaced by keyword-only
    ``names``, each defaulting to :data:`CONFIG_DEFAULT` (returns ``factory``)."""
    signature = inspect.signature(factory)
    fixed = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in fixed}
    keywords = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=CONFIG_DEFAULT)
                for name in names if name not in taken]
    factory.__signature__ = signature.replace(parameters=fixed + keywords)  # type: ignore[attr-defined]
    return factory


def host_values(factory_name: str, hyperparameters: dict[str, Any], *,
                traced_ok: tuple[str, ...] = ()) -> dict[str, Any]:
    """The config keywords among ``hyperparameters``: markers dropped, and the 0-d arrays
    ``inject_hyperparams`` made of numbers turned back into Python numbers (those named
    in ``traced_ok``, which the factory applies as arrays, left traced).

    Raises
    ------
    TypeError
        A value is traced (``inject_hyperparams`` under ``jax.jit``): it cannot shape
        the step; the message says to name it in ``static_args``.

    Examples
    --------
    >>> import numpy as np
    >>> host_values("shampoo", {"eps": CONFIG_DEFAULT, "precondition_frequency": np.array(5)})
    {'precondition_frequency': 5}
    """
    out = {}
    for name, value in hyperparameters.items():
        if value is CONFIG_DEFAULT:
            continue
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
            if _xp.is_traced(value) and name in traced_ok:
                out[name] = value
                continue
            if _xp.is_traced(value):
                raise TypeError(
                    f"{factory_name}'s {name} shapes the compiled step and cannot be an "
                    f"injected hyperparameter: pass optax.inject_hyperparams({factory_name}, "
                    f"static_args=({name!r},)), or leave {name} at its default")
            value = value.item()
        out[name] = value
    return out
