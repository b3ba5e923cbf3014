"""The stacked preconditioner: factor updates, inverse roots per stack, preconditioned blocks.

Every function here works on the arrays of one :class:`~matroot.optim.blocking.BlockGroup`
or one factor stack, through the array API only, so the same code runs on NumPy,
CuPy and PyTorch. The three steps are separate so a distributed layer can run
them for the groups and stacks a rank owns:

1. :func:`update_factors` — ``L ← β₂L + (1−β₂)GGᵀ``, ``R ← β₂R + (1−β₂)GᵀG`` for
   all blocks of a group with two batched matmuls, written into the group's
   slots of the stacks.
2. :func:`refresh_inverse_roots` — one :func:`matroot.inv_root_info` call per
   stack; matrices whose root failed keep their previous root.
3. :func:`precondition_blocks` — ``L^(-1/4) M R^(-1/4)`` (``L^(-1/2) m`` for
   vector blocks) for all blocks of a group, then :func:`graft` rescales each
   block to the norm of its Adam direction.
"""

from __future__ import annotations

from typing import NamedTuple

import array_api_extra as xpx
import numpy as np

from .. import _xp
from ..roots import inv_root_info, usable_roots
from .blocking import BlockGroup, BlockPlan, StackSpec

__all__ = [
    "FactorStacks",
    "factor_shape",
    "empty_stack",
    "identity_roots",
    "pack",
    "unpack",
    "init_stacks",
    "gather_blocks",
    "scatter_blocks",
    "assign",
    "update_factors",
    "refresh_inverse_roots",
    "usable_roots",
    "precondition_blocks",
    "block_norms",
    "graft",
]


class FactorStacks(NamedTuple):
    """Per-stack arrays, indexed like ``BlockPlan.stacks``.

    ``factors[i]`` and ``roots[i]`` have shape ``(count, n, n)``;
    ``failures[i]`` counts, per matrix, the root refreshes that failed.
    """

    factors: list
    roots: list
    failures: list


def factor_shape(spec: StackSpec, packed: bool) -> tuple[int, ...]:
    """Shape of a factor or root stack: ``(count, n, n)``, or ``(count, n(n+1)/2)`` packed."""
    if packed:
        return (spec.count, spec.size * (spec.size + 1) // 2)
    return (spec.count, spec.size, spec.size)


def identity_roots(spec: StackSpec, xp, device, dtype=None, *, packed=False):
    """The stack's roots before any refresh: identities, packed when ``packed``."""
    dtype = getattr(xp, spec.dtype) if dtype is None else dtype
    roots = xp.zeros((spec.count, spec.size, spec.size), dtype=dtype, device=device) + \
        _xp.identity_stack(xp, spec.size, dtype, device)
    return pack(roots) if packed else roots


def empty_stack(spec: StackSpec, xp, device, *, root_dtype=None, packed=False,
                keep_roots=True) -> tuple:
    """Zero factors, identity roots (in ``root_dtype``, default the factors'; None
    unless ``keep_roots``) and zero failure counts for one stack; factors and roots
    as packed upper triangles when ``packed``."""
    factors = xp.zeros(factor_shape(spec, packed), dtype=getattr(xp, spec.dtype), device=device)
    roots = identity_roots(spec, xp, device, root_dtype, packed=packed) if keep_roots else None
    return factors, roots, xp.zeros((spec.count,), dtype=xp.int32, device=device)


def init_stacks(plan: BlockPlan, xp, device, *, lazy: bool = False,
                root_dtypes=None, packed: bool = False, keep_roots: bool = True) -> FactorStacks:
    """Every stack of ``plan`` from :func:`empty_stack`, or None for each when ``lazy``."""
    stacks = FactorStacks([], [], [])
    root_dtypes = root_dtypes or [None] * len(plan.stacks)
    for spec, root_dtype in zip(plan.stacks, root_dtypes):
        arrays = (None, None, None) if lazy else empty_stack(spec, xp, device,
                                                              root_dtype=root_dtype,
                                                              packed=packed,
                                                              keep_roots=keep_roots)
        for store, array in zip(stacks, arrays):
            store.append(array)
    return stacks


def gather_blocks(group: BlockGroup, views, xp):
    """Stack the blocks of ``group`` into one ``(k, *group.shape)`` array.

    Parameters
    ----------
    group : BlockGroup
    views : sequence of arrays
        Per-parameter arrays in their view shape (matrix or vector), indexed by
        parameter number.
    xp : namespace
    """
    return xp.stack([views[b.param][b.index] for b in group.blocks])


def assign(array, index, value, *, in_place: bool, keep=None):
    """``array[index] = value``, in ``array`` itself when ``in_place`` (NumPy, CuPy,
    PyTorch), else on a copy, and always functionally on JAX. Returns the result.

    ``keep``, a 0-d boolean array, writes ``value`` only where it holds (the old
    entries stay otherwise): a step skipped on the device, without a host read.
    The one seam between the functional core and its in-place fast paths.
    """
    if keep is not None:
        xp = _xp.array_namespace(array)
        value = xp.where(keep, value, array[index])
    if in_place and _xp.is_torch_namespace(_xp.array_namespace(array)):
        # Plain __setitem__: array-api-extra's checks break torch.compile's graph.
        array[index] = value
        return array
    return xpx.at(array, index).set(value, copy=None if in_place else True)


def scatter_blocks(group: BlockGroup, blocks, outputs, *, in_place: bool = True) -> list:
    """Write ``blocks[j]`` into ``outputs[group.blocks[j].param]`` at its block's place.

    Returns the list of outputs (new arrays where they could not be written in place).
    """
    outputs = list(outputs)
    for j, b in enumerate(group.blocks):
        outputs[b.param] = assign(outputs[b.param], b.index, blocks[j, ...],
                                  in_place=in_place)
    return outputs


_INDEX_CACHE: dict = {}


def _packing_index(xp, n: int, device, unpack: bool):
    """Flat indices that pack an ``n×n`` matrix's upper triangle (row by row) or unpack it.

    Made once per size and device, so no index is copied to the device per step.
    """
    key = (xp.__name__, n, str(device), unpack)
    if key not in _INDEX_CACHE:
        rows, cols = np.triu_indices(n)
        if unpack:
            position = np.empty((n, n), dtype=np.int64)
            position[rows, cols] = np.arange(rows.size)
            position[cols, rows] = np.arange(rows.size)
            index = position.reshape(-1)
        else:
            index = rows * n + cols
        _INDEX_CACHE[key] = xp.asarray(index, device=device)
    return _INDEX_CACHE[key]


def pack(matrices):
    """The upper triangles of a ``(k, n, n)`` stack as ``(k, n(n+1)/2)``.

    Examples
    --------
    >>> import numpy as np
    >>> pack(np.arange(4.0).reshape(1, 2, 2))
    array([[0., 1., 3.]])
    """
    xp = _xp.array_namespace(matrices)
    k, n = matrices.shape[0], matrices.shape[-1]
    index = _packing_index(xp, n, _xp.device_of(matrices), unpack=False)
    return xp.take(xp.reshape(matrices, (k, n * n)), index, axis=1)


def unpack(packed, n: int):
    """The symmetric ``(k, n, n)`` stack whose upper triangles :func:`pack` gave.

    Examples
    --------
    >>> import numpy as np
    >>> unpack(np.array([[0.0, 1.0, 3.0]]), 2)[0]
    array([[0., 1.],
           [1., 3.]])
    """
    xp = _xp.array_namespace(packed)
    index = _packing_index(xp, n, _xp.device_of(packed), unpack=True)
    return xp.reshape(xp.take(packed, index, axis=1), (packed.shape[0], n, n))


def _accumulate(stack, first: int, statistic, beta2: float, in_place: bool, keep):
    # Only the group's own slots are rewritten: no copy of the whole stack. A packed
    # stack takes the statistic's upper triangle: the same arithmetic per entry.
    if stack.ndim == 2:
        statistic = pack(statistic)
    slots = (slice(first, first + statistic.shape[0]), ...)
    if beta2 == 1.0:
        return assign(stack, slots, stack[slots] + statistic, in_place=in_place, keep=keep)
    return assign(stack, slots, beta2 * stack[slots] + (1.0 - beta2) * statistic,
                  in_place=in_place, keep=keep)


def update_factors(group: BlockGroup, grad_blocks, factors, beta2: float, *,
                   in_place: bool = True, keep=None) -> list:
    """Fold one step's gradients into the group's factors.

    ``L ← β₂L + (1−β₂)GGᵀ`` and ``R ← β₂R + (1−β₂)GᵀG`` (for vector blocks
    ``L ← β₂L + (1−β₂)ggᵀ``); with ``β₂ = 1`` the factors are running sums.

    Parameters
    ----------
    group : BlockGroup
    grad_blocks : array, shape (k, *group.shape)
        From :func:`gather_blocks`, in the stacks' dtype.
    factors : list of arrays
        The factor stacks.
    beta2 : float
    in_place : bool
        Overwrite the group's slots of ``factors`` (not possible on JAX) or
        leave ``factors`` untouched.
    keep : 0-d boolean array, optional
        Where False the factors keep their values (see :func:`assign`).

    Returns
    -------
    list of arrays
        The factor stacks after the update.
    """
    xp = _xp.array_namespace(grad_blocks)
    factors = list(factors)
    if grad_blocks.ndim == 2:
        stack, first = group.factor_slots[0]
        factors[stack] = _accumulate(factors[stack], first,
                                     grad_blocks[:, :, None] * grad_blocks[:, None, :],
                                     beta2, in_place, keep)
        return factors
    transposed = xp.matrix_transpose(grad_blocks)
    for side, statistic in ((group.left, grad_blocks @ transposed),
                            (group.right, transposed @ grad_blocks)):
        if side is not None:
            factors[side[0]] = _accumulate(factors[side[0]], side[1], statistic, beta2,
                                           in_place, keep)
    return factors


def refresh_inverse_roots(spec: StackSpec, factors, roots, failures, *, method: str,
                          eps: float, options):
    """Recompute the inverse roots of one stack with a single ``inv_root_info`` call.

    Matrices whose new root is non-finite (in the roots' storage dtype too) or did
    not converge keep their previous root (identity before the first success, or
    when ``roots`` is None) and have their failure count raised by one.

    Parameters
    ----------
    spec : StackSpec
        The stack's size and root order.
    factors, roots : array, shape (count, n, n) or packed (count, n(n+1)/2)
        ``roots`` None: none kept (``keep_roots=False``); the result is then an
        unpacked stack in the factors' dtype.
    failures : array of int32, shape (count,)
    method : str
        Any :func:`matroot.inv_root` method.
    eps : float
        Ridge: the roots are of ``factor + eps·I``.
    options : mapping
        Further :func:`matroot.inv_root` keywords (``tol``, ``max_iter``, ...).

    Returns
    -------
    roots : array, shape (count, n, n)
    failures : array of int32, shape (count,)
    result : InvRootResult
        The solver's diagnostics, for logging.
    """
    xp = _xp.array_namespace(factors)
    if factors.ndim == 2:
        factors = unpack(factors, spec.size)
    result = inv_root_info(factors, spec.root, method=method, eps=eps, check_finite=False,
                           **options)
    ok = usable_roots(result, options.get("tol"))
    if roots is None:
        roots = identity_roots(spec, xp, _xp.device_of(factors), factors.dtype)
    root = xp.astype(result.root, roots.dtype, copy=False)
    if root.dtype != result.root.dtype:
        # A root fine in its compute dtype can overflow a 16-bit storage dtype (float16
        # ends at 65504): it failed as surely as a solve that diverged.
        ok = ok & xp.all(xp.isfinite(root), axis=(-2, -1))
    if roots.ndim == 2:
        new_roots = xp.where(ok[:, None], pack(root), roots)
    else:
        new_roots = _xp.batched_where(ok, root, roots)
    return new_roots, failures + xp.astype(~ok, xp.int32), result


def precondition_blocks(group: BlockGroup, blocks, roots):
    """The Shampoo directions ``L^(-1/4) M R^(-1/4)`` of all blocks of a group.

    One-sided blocks get ``L^(-1/2) M`` or ``M R^(-1/2)``, vector blocks ``L^(-1/2) m``.

    Parameters
    ----------
    group : BlockGroup
    blocks : array, shape (k, *group.shape)
        The (first-moment) blocks to precondition.
    roots : list of arrays
        The inverse-root stacks.

    Returns
    -------
    array, shape (k, *group.shape)
    """
    xp = _xp.array_namespace(blocks)
    k = blocks.shape[0]

    def root_slots(side):
        stack, first = side
        slots = roots[stack][first:first + k, ...]
        if slots.ndim == 2:
            slots = unpack(slots, blocks.shape[1 if side is group.left else -1])
        return xp.astype(slots, blocks.dtype, copy=False)

    if blocks.ndim == 2:
        return (root_slots(group.left) @ blocks[:, :, None])[:, :, 0]
    if group.left is not None:
        blocks = root_slots(group.left) @ blocks
    if group.right is not None:
        blocks = blocks @ root_slots(group.right)
    return blocks


def block_norms(blocks):
    """Frobenius norm of each block of a ``(k, ...)`` array, without overflow in the squares."""
    xp = _xp.array_namespace(blocks)
    axes = tuple(range(1, blocks.ndim))
    peak = xp.max(xp.abs(blocks), axis=axes)
    safe = xp.where(peak > 0, peak, xp.ones_like(peak))
    expand = (slice(None),) + (None,) * (blocks.ndim - 1)
    scaled = blocks / safe[expand]
    return peak * xp.sqrt(xp.sum(scaled * scaled, axis=axes))


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
