"""``matroot.optim.optax.muon``: stacked Muon as an optax ``GradientTransformation``.

A thin shell over :func:`matroot.optim.muon.core.muon_directions`: leaves chosen by
``use_muon`` (by default :func:`~matroot.optim.muon.core.default_use_muon` on the
leaf's key path and shape) are orthogonalized, one polar call per matrix shape;
the others take AdamW's direction scaled by ``adamw_lr_ratio``. The state is a
NamedTuple of arrays and the update is ``jax.jit``-able.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ... import _xp
from ..muon.core import (MuonConfig, MuonState, check_muon_keywords, default_use_muon,
                         is_unnamed, muon_directions, unnamed_matrices_warning)
from ..shampoo_core.gradients import all_finite, apply_nonfinite_policy, nonfinite_params
from .keywords import host_values, with_keywords
from .leaves import check_leaves_fit
from .muon_layout import leaf_views, torch_layout_warning

__all__ = ["muon", "scale_by_muon", "MuonOptaxState"]


class MuonOptaxState(NamedTuple):
    """``count`` (int32 steps taken) and the per-leaf moments (None for the second
    moment of a Muon leaf)."""

    count: Any
    momentum: list
    exp_avg_sq: list


def _muon_leaves(tree, use_muon, views=None, warn: bool = False) -> list[bool]:
    """Per leaf: Muon or AdamW, by ``use_muon`` (a pytree of bools or a callable of
    ``(path_string, leaf)``) or the default rule on the leaf's key path joined by
    ``.`` (``{"params": {"Dense_0": {"kernel": ...}}}`` is ``params.Dense_0.kernel``).
    ``views``: per leaf, its :class:`~.muon_layout.LeafView` or None (the rule
    judges a viewed leaf by its view's shape). With ``warn``, the rule's matrices
    whose path holds no name (only positions, as in a list of arrays), and those of
    three or more dimensions without a view, draw a warning.

    A pytree of bools is matched to ``tree`` by structure, as ``optax.masked``
    matches its mask: it may be a prefix of ``tree`` (one bool for a subtree), and
    the leaves ``optax.masked`` hides from its inner transformation are dropped with
    their flags. Matching by position alone would give the flags to the wrong leaves.
    """
    if use_muon is not None and not callable(use_muon):
        try:
            flags = jax.tree_util.tree_map(
                lambda flag, subtree: jax.tree_util.tree_map(lambda _: bool(flag), subtree),
                use_muon, tree)
        except ValueError as error:
            raise ValueError("use_muon must be a pytree of bools with the parameters' "
                             f"structure (or a prefix of it): {error}") from None
        return jax.tree_util.tree_leaves(flags)
    named = [(jax.tree_util.keystr(path, simple=True, separator="."), leaf)
             for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if use_muon is not None:
        return [bool(use_muon(name, leaf)) for name, leaf in named]
    # A leaf with dimension numbers (its view) is judged as the matrices it is read as.
    views = views or [None] * len(named)
    flags = [default_use_muon(name, leaf.shape if view is None else view.view)
             for (name, leaf), view in zip(named, views)]
    if warn:
        torch_layout_warning([leaf.shape for (_, leaf), flag, view in zip(named, flags, views)
                              if flag and view is None and leaf.ndim > 2])
        unnamed_matrices_warning(
            [leaf.shape for (name, leaf), flag in zip(named, flags) if flag and is_unnamed(name)],
            "muon", "Give the parameters as a dict whose keys name them ('embed', "
            "'head', ...), or pass use_muon (a pytree of bools or a callable).")
    return flags


def _stack_placement(sharding) -> Callable[[Any], Any] | None:
    """The constraint that puts a ``(count, m, n)`` stack's first axis where
    ``sharding`` says (a ``NamedSharding`` whose spec names the stack axis' mesh
    axes; the matrix axes stay whole)."""
    if sharding is None:
        return None
    if not isinstance(sharding, jax.sharding.NamedSharding) or len(sharding.spec) != 1:
        raise ValueError(
            "stack_sharding must be a jax.sharding.NamedSharding whose spec names the "
            "stack axis only, e.g. NamedSharding(mesh, PartitionSpec('data')), got "
            f"{sharding!r}")
    spec = jax.sharding.PartitionSpec(sharding.spec[0], None, None)
    placed = jax.sharding.NamedSharding(sharding.mesh, spec)
    return lambda stack: jax.lax.with_sharding_constraint(stack, placed)


def scale_by_muon(*, use_muon: Any = None, adamw_lr_ratio: float = 1.0,
                  split: Callable[[str, Any], int] | None = None,
                  stack_sharding: Any = None, weight_dimension_numbers: Any = None,
                  **config: Any) -> optax.GradientTransformation:
    """The Muon/AdamW direction ``+D`` of every leaf, without learning rate or decay.

    Parameters
    ----------
    use_muon : pytree of bool or callable, optional
        Which leaves get Muon: a pytree of bools with the parameters' structure
        or a prefix of it (matched as ``optax.masked`` matches its mask, so the
        same tree works inside ``optax.masked``), or a callable of
        ``(path_string, leaf)``; by default ≥ 2-D leaves whose path names no
        embedding or head and are not vectors (one row or column), by the leaf's
        key path joined with ``.`` (:func:`~matroot.optim.muon.core.default_use_muon`);
        leaves in a list or tuple have no name and draw a warning.
    adamw_lr_ratio : float
        The AdamW leaves' learning rate as a multiple of the Muon one.
    split : callable, optional
        ``split(path_string, leaf)`` → how many equal blocks of rows each matrix of
        a Muon leaf is orthogonalized as (3 for a fused QKV kernel stored
        ``(3·d, d)``; :func:`~matroot.optim.muon.core.matrix_stack_shape`); 1 when
        omitted.
    stack_sharding : jax.sharding.NamedSharding, optional
        Where the stack axis of each same-shape stack of Muon matrices goes, e.g.
        ``NamedSharding(mesh, PartitionSpec("data"))``: each device then
        orthogonalizes its share of the matrices whole, and XLA moves their rows
        in and out (all-to-all) from wherever the gradients and moments are
        (replicated, or sharded like the parameters). For ``jax.jit`` over a
        mesh; the updates equal the unsharded ones to rounding.
    weight_dimension_numbers : MuonDimensionNumbers, pytree or callable, optional
        Which axes of a Muon leaf are its matrix's input (``reduction_axis``) and
        output (``output_axis``), the others batch axes, as ``optax.contrib.muon``
        takes them (``optax.contrib.MuonDimensionNumbers``): one for every leaf, a
        pytree of them (None where the default holds) or a callable of the params
        returning one (:mod:`.muon_layout`). By default a leaf is read in torch's
        layouts: ``(out, in)``, ``(experts, out, in)``, ``(out, in, kh, kw)``. flax's
        and haiku's dense kernels are ``(in, out)`` (pass
        ``MuonDimensionNumbers(0, 1)`` for the shape scale optax's Muon and torch's
        give them) and their convolutions ``(kh, kw, in, out)``
        (``MuonDimensionNumbers((0, 1, 2), 3)``); Muon leaves of three or more
        dimensions without one draw a warning.
    **config
        :class:`~matroot.optim.muon.core.MuonConfig` fields.
    """
    check_muon_keywords(config, "scale_by_muon")
    config = host_values("scale_by_muon", config, traced_ok=("momentum",))
    # An injected μ (optax.inject_hyperparams under jit: a momentum warm-up) is an
    # array the core applies as it is; the config keeps its default.
    momentum = config.pop("momentum") if _xp.is_traced(config.get("momentum")) else None
    settings = MuonConfig(**config)
    place = _stack_placement(stack_sharding)

    def init_fn(params):
        leaves = jax.tree_util.tree_leaves(params)
        muon = _muon_leaves(params, use_muon, leaf_views(params, weight_dimension_numbers),
                            warn=True)
        return MuonOptaxState(jnp.zeros((), jnp.int32), [jnp.zeros_like(x) for x in leaves],
                              [None if m else jnp.zeros_like(x) for x, m in zip(leaves, muon)])

    def update_fn(updates, state, params=None):
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        check_leaves_fit(updates, [m.shape for m in state.momentum], "muon")
        # A state restored from a checkpoint may hold NumPy arrays (flax.serialization).
        state = jax.tree_util.tree_map(jnp.asarray, state)
        # NaN/Inf gradients: eagerly one host read decides, and "raise" raises (naming
        # the leaves) before any work; a traced step cannot raise, so there, and with
        # "skip", the step is a zero update that leaves the state as it was (Shampoo's
        # and SOAP's optax rule).
        finite = all_finite(leaves)
        eagerly_finite = None if _xp.is_traced(finite) else bool(finite)
        if eagerly_finite is False and settings.nonfinite_grads == "raise":
            apply_nonfinite_policy(nonfinite_params(jnp, leaves), "raise",
                                   numbering=" (pytree leaf order)")
        views = leaf_views(updates, weight_dimension_numbers)
        muon = _muon_leaves(updates, use_muon, views)
        # Muon leaves with dimension numbers go to the core as (batch, out, in) stacks.
        views = [view if m else None for view, m in zip(views, muon)]
        into = lambda arrays: [x if v is None else v.into(x)  # noqa: E731
                               for x, v in zip(arrays, views)]
        back = lambda arrays: [x if v is None else v.back(x)  # noqa: E731
                               for x, v in zip(arrays, views)]
        splits = None if split is None else [
            int(split(jax.tree_util.keystr(path, simple=True, separator="."), leaf))
            for path, leaf in jax.tree_util.tree_flatten_with_path(updates)[0]]
        core = MuonState(into(state.momentum), state.exp_avg_sq, [state.count] * len(leaves))
        directions, new = muon_directions(
            into(leaves), core, muon, settings,
            momentum=None if momentum is None else [momentum] * len(leaves), split=splits,
            place=place)
        directions = [d if m else d * adamw_lr_ratio for d, m in zip(back(directions), muon)]
        new_state = MuonOptaxState(state.count + 1, back(new.momentum), new.exp_avg_sq)
        if eagerly_finite:
            return treedef.unflatten(directions), new_state
        directions = [jnp.where(finite, d, jnp.zeros_like(d)) for d in directions]
        kept = jax.tree_util.tree_map(lambda now, was: jnp.where(finite, now, was),
                                      new_state, state)
        return treedef.unflatten(directions), kept

    return optax.GradientTransformation(init_fn, update_fn)


def muon(learning_rate: float | Callable, *, weight_decay: float = 0.0,
         weight_decay_mask: Any = None, use_muon: Any = None, adamw_lr_ratio: float = 1.0,
         split: Callable[[str, Any], int] | None = None, stack_sharding: Any = None,
         weight_dimension_numbers: Any = None,
         **config: Any) -> optax.GradientTransformation:
    """Stacked Muon for optax: ``scale_by_muon``, decoupled weight decay, learning rate.

    Parameters
    ----------
    learning_rate : float or optax schedule
        Muon's step size; AdamW leaves take ``adamw_lr_ratio`` times it.
    weight_decay : float
        Decoupled decay ``W ← W − lr·weight_decay·W``, on every leaf unless
        ``weight_decay_mask`` says otherwise.
    weight_decay_mask : pytree or callable, optional
        Which leaves decay, as ``optax.add_decayed_weights``'s ``mask`` (and
        ``optax.contrib.muon``'s ``weight_decay_mask``): a pytree of bools like the
        parameters, or a function of the parameters returning one; e.g. leave out
        biases and norms, as the torch shell's AdamW part does by default.
    use_muon, adamw_lr_ratio, split, stack_sharding, weight_dimension_numbers, **config
        As :func:`scale_by_muon`.

    Returns
    -------
    optax.GradientTransformation
        ``update`` needs ``params`` when ``weight_decay > 0``.

    Examples
    --------
    >>> import jax, jax.numpy as jnp, optax
    >>> from matroot.optim.optax import muon
    >>> params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    >>> opt = muon(0.05, adamw_lr_ratio=0.2)
    >>> state = opt.init(params)
    >>> loss = lambda p: jnp.sum((p["w"] - 2.0) ** 2) + jnp.sum(p["b"] ** 2)
    >>> @jax.jit
    ... def step(params, state):
    ...     updates, state = opt.update(jax.grad(loss)(params), state, params)
    ...     return optax.apply_updates(params, updates), state
    >>> for _ in range(10):
    ...     params, state = step(params, state)
    >>> bool(loss(params) < 12.0)
    True
    """
    # An array weight decay (optax.inject_hyperparams) may be zero only at some steps.
    no_decay = isinstance(weight_decay, (int, float)) and weight_decay == 0
    decay = [] if no_decay else [optax.add_decayed_weights(weight_decay,
                                                           mask=weight_decay_mask)]
    settings = host_values("muon", config, traced_ok=("momentum",))
    return optax.chain(scale_by_muon(use_muon=use_muon, adamw_lr_ratio=adamw_lr_ratio,
                                     split=split, stack_sharding=stack_sharding,
                                     weight_dimension_numbers=weight_dimension_numbers,
                                     **settings),
                       *decay, optax.scale_by_learning_rate(learning_rate))


#: MuonConfig's keywords, named in the factories' signatures for optax.inject_hyperparams.
_KEYWORDS = list(MuonConfig.__dataclass_fields__)
with_keywords(scale_by_muon, _KEYWORDS)
with_keywords(muon, _KEYWORDS)
