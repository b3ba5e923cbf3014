"""The optax shells' check that an update's pytree fits the state ``init`` made.

An optax state holds one entry per leaf of the parameters it was initialised with;
gradients of a model that has since changed (a resized layer, a leaf added) would
otherwise meet that state deep inside the step, as a broadcasting error or a count
of "parameters" the user never passed.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

__all__ = ["check_leaves_fit"]


def check_leaves_fit(updates, shapes: Sequence[tuple[int, ...]], name: str) -> None:
    """Raise ValueError, naming the first leaf that differs, unless the leaves of
    ``updates`` have ``shapes`` (those of the parameters ``init`` saw), in order.

    Examples
    --------
    >>> import jax.numpy as jnp
    >>> check_leaves_fit({"w": jnp.ones((2, 3))}, [(2, 3)], "shampoo")
    >>> try:
    ...     check_leaves_fit({"w": jnp.ones((2, 4))}, [(2, 3)], "shampoo")
    ... except ValueError as error:
    ...     print(str(error).split(": ")[1].split(";")[0])
    leaf 'w' has shape (2, 4) where the state has (2, 3)
    """
    paths = jax.tree_util.tree_flatten_with_path(updates)[0]
    if len(paths) != len(shapes):
        found: str | None = (f"the gradients have {len(paths)} leaves where the state has "
                             f"{len(shapes)}")
    else:
        found = next((f"leaf {_name(path)!r} has shape {tuple(leaf.shape)} where the state "
                      f"has {tuple(shape)}" for (path, leaf), shape in zip(paths, shapes)
                      if tuple(leaf.shape) != tuple(shape)), None)
    if found is None:
        return
    raise ValueError(f"{name}'s state was made by init for other parameters: {found}; "
                     "init the optimizer again for a changed model")


def _name(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".") or "the root"
