"""The stacked preconditioner: factor updates, inverse roots per stack, preconditioned blocks.

Every function here works on the arrays of one
:class:`~matroot.optim.shampoo_core.blocking.BlockGroup` or one factor stack, through
the array API only, so the same code runs on NumPy, CuPy and PyTorch. The three
steps are separate so a distributed layer can run them for the groups and stacks a
rank owns:

1. :func:`update_factors` — ``L ← β₂L + (1−β₂)GGᵀ``, ``R ← β₂R + (1−β₂)GᵀG`` for
   all blocks of a group with two batched matmuls, written into the group's
   slots of the stacks, and the factors' carried λmax bounds
   (:mod:`matroot.optim.shampoo_core.factor_bounds`) advanced with them.
2. :func:`refresh_inverse_roots` — one :func:`matroot.inv_root_info` call per
   stack, by default in fixed steps certified to the optimizer's ``rtol`` with no
   host read (:mod:`matroot.optim.shampoo_core.root_options`); matrices whose root
   failed keep their previous root.
3. :func:`precondition_blocks` — ``L^(-1/4) M R^(-1/4)`` (``L^(-1/2) m`` for
   vector blocks) for all blocks of a group; :func:`matroot.optim.shampoo_core.grafting.graft`
   then rescales each block to the norm of its Adam direction.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ... import _xp
from ...certify.accuracy import unit_roundoff
from ...roots.api import InvRootResult, inv_root_info
from .blocking import BlockGroup, BlockPlan, FactorStackShape
from .packing import diagonals, pack, unpack
from .stack_io import assign, gather_blocks, scatter_blocks, select, write_blocks
from .skipping import SkipCoefficients
from .factor_bounds import (
    advance_bounds_in_place,
    advanced_bounds,
    bounds_after_refresh,
    carried_lambda_max,
    rounding_margin,
    unknown_bounds,
    zero_bounds,
)

__all__ = [
    "FactorStacks",
    "FactorUpdate",
    "RootRefresh",
    "factor_shape",
    "empty_stack",
    "identity_roots",
    "pack",
    "unpack",
    "init_stacks",
    "gather_blocks",
    "scatter_blocks",
    "write_blocks",
    "assign",
    "update_factors",
    "refresh_inverse_roots",
    "precondition_blocks",
]


class FactorStacks(NamedTuple):
    """Per-stack arrays, indexed like ``BlockPlan.stacks``.

    ``factors[i]`` and ``roots[i]`` have shape ``(count, n, n)``;
    ``failures[i]`` counts, per matrix, the root refreshes that failed;
    ``bounds[i]``, shape ``(count, 2)``, carries each factor's λmax bound
    (:mod:`matroot.optim.shampoo_core.factor_bounds`).
    """

    factors: list
    roots: list
    failures: list
    bounds: list


class FactorUpdate(NamedTuple):
    """The factor stacks and their carried λmax bounds after :func:`update_factors`."""

    factors: list
    bounds: list


class RootRefresh(NamedTuple):
    """One stack after :func:`refresh_inverse_roots`: its roots, failure counts and
    carried bounds, and the solver's diagnostics (for logging)."""

    roots: Any
    failures: Any
    bounds: Any
    result: InvRootResult


def factor_shape(stack_shape: FactorStackShape, packed: bool) -> tuple[int, ...]:
    """Shape of a factor or root stack: ``(count, n, n)``, or ``(count, n(n+1)/2)`` packed."""
    if packed:
        return (stack_shape.count, stack_shape.size * (stack_shape.size + 1) // 2)
    return (stack_shape.count, stack_shape.size, stack_shape.size)


def identity_roots(stack_shape: FactorStackShape, xp, device, dtype=None, *, packed=False):
    """The stack's roots before any refresh: identities, packed when ``packed``."""
    dtype = getattr(xp, stack_shape.dtype) if dtype is None else dtype
    count, size = stack_shape.count, stack_shape.size
    roots = xp.zeros((count, size, size), dtype=dtype, device=device) + \
        _xp.identity_stack(xp, size, dtype, device)
    return pack(roots) if packed else roots


def empty_stack(stack_shape: FactorStackShape, xp, device, *, root_dtype=None, packed=False,
                keep_roots=True) -> tuple:
    """Zero factors, identity roots (in ``root_dtype``, default the factors'; None
    unless ``keep_roots``), zero failure counts and zero λmax bounds for one stack;
    factors and roots as packed upper triangles when ``packed``."""
    dtype = getattr(xp, stack_shape.dtype)
    factors = xp.zeros(factor_shape(stack_shape, packed), dtype=dtype, device=device)
    roots = (identity_roots(stack_shape, xp, device, root_dtype, packed=packed)
             if keep_roots else None)
    return (factors, roots, xp.zeros((stack_shape.count,), dtype=xp.int32, device=device),
            zero_bounds(stack_shape.count, xp, dtype, device))


def init_stacks(plan: BlockPlan, xp, device, *, lazy: bool = False,
                root_dtypes=None, packed: bool = False, keep_roots: bool = True) -> FactorStacks:
    """Every stack of ``plan`` from :func:`empty_stack`, or None for each when ``lazy``."""
    stacks = FactorStacks([], [], [], [])
    root_dtypes = root_dtypes or [None] * len(plan.stacks)
    for stack_shape, root_dtype in zip(plan.stacks, root_dtypes):
        arrays = (None,) * len(stacks) if lazy else empty_stack(stack_shape, xp, device,
                                                              root_dtype=root_dtype,
                                                              packed=packed,
                                                              keep_roots=keep_roots)
        for store, array in zip(stacks, arrays):
            store.append(array)
    return stacks


def _accumulate(stack, bounds, first: int, statistic, inner: int, beta2: float,
                in_place: bool, step_taken):
    """One side's factors and bounds after folding in ``statistic`` (a product over
    ``inner`` terms per entry), in the group's slots.

    Only the group's own slots are rewritten: no copy of the whole stack. A packed
    stack takes the statistic's upper triangle: the same arithmetic per entry.
    """
    xp = _xp.array_namespace(statistic)
    k, n = statistic.shape[0], statistic.shape[-1]
    slots = (slice(first, first + k), ...)
    entries = pack(statistic) if stack.ndim == 2 else statistic
    margin = rounding_margin(xp, statistic.dtype, inner, n)
    if in_place and _xp.backend_name(xp) != "jax":
        # The slots' views overwritten with in-place operators: the same arithmetic
        # as below, without the new arrays and the copies back. A step skipped on the
        # device brings zero gradients (phases.accumulate_moments), so its statistic
        # adds zero; the factors' decay and the bounds' change are multiplied out.
        updated = stack[slots]
        skip = None if step_taken is None else step_taken.of(xp, updated.dtype)
        if beta2 != 1.0:
            updated *= beta2 if skip is None else skip.factor_decay
            entries = (1.0 - beta2) * entries
        updated += entries
        advance_bounds_in_place(bounds[slots], statistic, diagonals(updated, n), beta2,
                                margin, skip=skip)
        return stack, bounds
    if step_taken is not None:
        step_taken = step_taken.step_taken
    if beta2 == 1.0:
        updated = stack[slots] + entries
    else:
        updated = beta2 * stack[slots] + (1.0 - beta2) * entries
    stack = assign(stack, slots, updated, in_place=in_place, step_taken=step_taken)
    new_bounds = advanced_bounds(bounds[slots], statistic, diagonals(updated, n), beta2,
                                 margin)
    return stack, assign(bounds, slots, new_bounds, in_place=in_place, step_taken=step_taken)


def _merged(xp, sides):
    """The sides of a square group whose factors sit in consecutive slots of one stack
    (its left factors, then its right ones), as one statistic: one accumulation for
    both."""
    if len(sides) == 2:
        ((s0, f0), st0, i0), ((s1, f1), st1, i1) = sides
        if s0 == s1 and f1 == f0 + st0.shape[0] and i0 == i1 and st0.shape == st1.shape:
            return [((s0, f0), xp.concat([st0, st1], axis=0), i0)]
    return sides


def update_factors(group: BlockGroup, grad_blocks, factors, bounds, beta2: float, *,
                   in_place: bool = True, step_taken=None) -> FactorUpdate:
    """Fold one step's gradients into the group's factors and their λmax bounds.

    ``L ← β₂L + (1−β₂)GGᵀ`` and ``R ← β₂R + (1−β₂)GᵀG`` (for vector blocks
    ``L ← β₂L + (1−β₂)ggᵀ``); with ``β₂ = 1`` the factors are running sums. Each
    factor's bound moves by the trace of its statistic, ``‖G‖²_F``
    (:func:`~matroot.optim.shampoo_core.factor_bounds.advanced_bounds`).

    Parameters
    ----------
    group : BlockGroup
    grad_blocks : array, shape (k, *group.shape)
        From :func:`gather_blocks`, in the stacks' dtype.
    factors, bounds : list of arrays
        The factor stacks and their ``(count, 2)`` bound stacks.
    beta2 : float
    in_place : bool
        Overwrite the group's slots of ``factors`` and ``bounds`` (not possible on
        JAX) or leave them untouched.
    step_taken : 0-d boolean array or SkipCoefficients, optional
        Where False the factors keep their values (see :func:`assign`); in place, the
        gradients must then be finite (zeros). One
        :class:`~matroot.optim.shampoo_core.skipping.SkipCoefficients` (its
        ``factor_beta`` this ``beta2``) passed to every group of a step makes its
        coefficients once.

    Returns
    -------
    FactorUpdate
        The factor and bound stacks after the update.
    """
    xp = _xp.array_namespace(grad_blocks)
    factors, bounds = list(factors), list(bounds)
    if step_taken is not None and not isinstance(step_taken, SkipCoefficients):
        step_taken = SkipCoefficients(step_taken, factor_beta=beta2)
    if grad_blocks.ndim == 2:
        sides = [(group.factor_slots[0], grad_blocks[:, :, None] * grad_blocks[:, None, :], 1)]
    else:
        # Form a side's statistic only when that side is preconditioned: the other
        # side of a long one-sided block (an embedding's 50000 rows) would be huge.
        transposed = xp.matrix_transpose(grad_blocks)
        sides = []
        if group.left is not None:
            sides.append((group.left, grad_blocks @ transposed, grad_blocks.shape[-1]))
        if group.right is not None:
            sides.append((group.right, transposed @ grad_blocks, grad_blocks.shape[-2]))
    for (stack, first), statistic, inner in _merged(xp, sides):
        factors[stack], bounds[stack] = _accumulate(factors[stack], bounds[stack], first,
                                                    statistic, inner, beta2, in_place, step_taken)
    return FactorUpdate(factors, bounds)


def refresh_inverse_roots(stack_shape: FactorStackShape, factors, roots, failures, bounds, *,
                          method: str, eps: float, options, no_sync: bool = False,
                          in_place: bool = False) -> RootRefresh:
    """Recompute the inverse roots of one stack with a single ``inv_root_info`` call.

    The call's keywords are ``options`` with the optimizer's defaults filled in
    (:meth:`~matroot.optim.shampoo_core.root_options.RootOptions.solve_keywords`): by
    default a fixed-step solve certified to ``rtol``, its verdict left on the device.
    Matrices whose new root is non-finite (in the roots' storage dtype too) or did not
    converge keep their previous root (identity before the first success, or when
    ``roots`` is None) and have their failure count raised by one, by a select: the
    refresh reads nothing on the host unless the call's verdict does.

    A fixed-step solve scales each matrix by its own Schatten bound and takes no
    carried λmax bound (the bounds go on advancing, unchanged by the refresh). An
    adaptive solve is given the carried bounds
    (:func:`~matroot.optim.shampoo_core.factor_bounds.carried_lambda_max`): with the
    host verdict, where every bound of the stack is tight, else the solver finds its
    own (which restart the carried ones); with the device verdict, per matrix, the
    carried bound where it is tight and the factor's Frobenius bound elsewhere, so
    no host read chooses.

    Parameters
    ----------
    stack_shape : FactorStackShape
        The stack's size and root order.
    factors, roots : array, shape (count, n, n) or packed (count, n(n+1)/2)
        ``roots`` None: none kept (``keep_roots=False``); the result is then an
        unpacked stack in the factors' dtype.
    failures : array of int32, shape (count,)
    bounds : array, shape (count, 2)
        The factors' carried λmax bounds.
    method : str
        Any :func:`matroot.inv_root` method.
    eps : float
        Ridge: the roots are of ``factor + eps·I``.
    options : RootOptions
        The ``root_options``.
    no_sync : bool
        The step reads nothing on the host (``nonfinite_grads="skip"``): the default
        verdict is then the device's for every method.
    in_place : bool
        Write the kept roots, failure counts and bounds into ``roots``, ``failures``
        and ``bounds`` (mutable arrays; not ``roots=None``), so a captured step (a
        CUDA graph) finds them where the steps between refreshes read them.

    Returns
    -------
    RootRefresh
    """
    xp = _xp.array_namespace(factors)
    if factors.ndim == 2:
        factors = unpack(factors, stack_shape.size)
    p = stack_shape.root
    keywords = options.solve_keywords(factors, p, method=method, eps=eps, no_sync=no_sync)

    def solve(upper=None):
        # The one place the optimizer calls the solver (every refresh, kept roots or
        # not, torch and optax shells alike).
        return inv_root_info(factors, p, method=method, eps=eps, check_finite=False,
                             lambda_max_upper=upper, **keywords)

    if keywords["steps"] == "fixed":
        result = solve()
        ok, new_bounds = result.converged, bounds
    else:
        result, ok, new_bounds = _adaptive_refresh(
            solve, factors, bounds, eps, on_device=keywords["verdict"] == "device")
    packed = roots is not None and roots.ndim == 2
    if roots is None:
        # The fallback of a stack with no kept roots: one identity, broadcast by the
        # select below, not a stack of them.
        roots = _xp.identity_stack(xp, stack_shape.size, factors.dtype, _xp.device_of(factors))
    root = xp.astype(result.root, roots.dtype, copy=False)
    if root.dtype != result.root.dtype:
        # A root fine in its compute dtype can overflow a 16-bit storage dtype (float16
        # ends at 65504): it failed as surely as a solve that diverged.
        ok = ok & xp.all(xp.isfinite(root), axis=(-2, -1))
    overwrite = in_place and _xp.backend_name(xp) != "jax"
    if packed:
        new_roots = select(ok[:, None], pack(root), roots, in_place=overwrite)
    else:
        new_roots = select(ok[:, None, None], root, roots, in_place=overwrite)
    if not overwrite:
        return RootRefresh(new_roots, failures + xp.astype(~ok, xp.int32), new_bounds, result)
    # torch adds a boolean to an integer as 0 or 1; the array API needs the cast.
    failures += ~ok if _xp.is_torch_namespace(xp) else xp.astype(~ok, failures.dtype)
    if new_bounds is not bounds:
        bounds[...] = new_bounds
    return RootRefresh(new_roots, failures, bounds, result)



def _adaptive_refresh(solve, factors, bounds, eps: float, *, on_device: bool):
    """``(result, ok, bounds)`` of an adaptive solve given the carried λmax bounds
    (:func:`refresh_inverse_roots`)."""
    xp = _xp.array_namespace(factors)
    n = factors.shape[-1]
    tight, upper = carried_lambda_max(bounds, eps)
    if on_device or _xp.is_traced(tight):
        # Per matrix, no host read: the carried bound where it is tight, else
        # λmax(F + eps·I) ≤ ‖F‖_F + eps, widened by the norm's rounding.
        fresh = (_xp.frobenius_norm(factors) + eps) * \
            (1.0 + 2 * n * n * unit_roundoff(xp, factors.dtype))
        result = solve(xp.where(tight, upper, fresh))
        ok = result.converged
        # A tight bound whose root failed is made unknown; the others go on advancing.
        return result, ok, xp.where((tight & ~ok)[:, None], unknown_bounds(
            bounds.shape[0], xp, bounds.dtype, _xp.device_of(bounds)), bounds)
    carried = bool(xp.all(tight))
    result = solve(upper if carried else None)
    ok = result.converged
    margin_traces = rounding_margin(xp, factors.dtype, n, n) * \
        xp.sum(xp.linalg.diagonal(factors), axis=-1)
    return result, ok, bounds_after_refresh(bounds, result, ok, eps=eps, carried=carried,
                                            margin_traces=margin_traces)


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
