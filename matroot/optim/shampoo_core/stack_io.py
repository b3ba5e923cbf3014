"""Blocks between parameters and stacks: the per-stack step's gather, write-back and
the one seam of its in-place writes.

A Shampoo step (and any optimizer built on its per-stack path) works on stacks: the
blocks of one shape from every parameter, as one ``(k, *shape)`` array.
:func:`gather_blocks` makes such a stack from per-parameter arrays (one operation per
stack), :func:`write_blocks` gives the per-parameter results back (views where a
parameter is one block, one copy for all the others), and :func:`assign` is how
every in-place write of the functional core happens (a select where a step is
skipped on the device). Elementwise work over per-parameter lists is
:mod:`matroot.optim.shampoo_core.lists`.
"""

from __future__ import annotations

import math

import array_api_extra as xpx

from ... import _xp
from . import lists
from .blocking import BlockGroup, BlockPlan

__all__ = ["gather_blocks", "assign", "select", "scatter_blocks", "write_blocks"]


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


def select(mask, new, old, *, in_place: bool):
    """``where(mask, new, old)``; written into ``old`` when ``in_place`` (a mutable
    array: one operation on torch, its ``out=``), so the result is ``old`` itself."""
    xp = _xp.array_namespace(old)
    if not in_place:
        return xp.where(mask, new, old)
    if _xp.is_torch_namespace(xp):
        import torch
        return torch.where(mask, new, old, out=old)
    old[...] = xp.where(mask, new, old)
    return old


def assign(array, index, value, *, in_place: bool, step_taken=None):
    """``array[index] = value``, in ``array`` itself when ``in_place`` (NumPy, CuPy,
    PyTorch), else on a copy, and always functionally on JAX. Returns the result.

    ``step_taken``, a 0-d boolean array, writes ``value`` only where it holds (the old
    entries stay otherwise): a step skipped on the device, without a host read.
    The one seam between the functional core and its in-place fast paths.
    """
    if step_taken is not None:
        xp = _xp.array_namespace(array)
        value = xp.where(step_taken, value, array[index])
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


def _area(block) -> int:
    rows = block.rows[1] - block.rows[0]
    return rows if block.cols is None else rows * (block.cols[1] - block.cols[0])


def write_blocks(xp, plan: BlockPlan, runs, results, like) -> list:
    """Per parameter, its view-shaped array made of its blocks in ``results`` (one
    ``(k, *run.shape)`` array per run); None for parameters in no run.

    A parameter that is one block gets a view of its run's result (no copy); the
    others are assembled (zeros where the runs do not cover them), on PyTorch in one
    buffer per dtype by one foreach copy, so the number of operations does not grow
    with the number of parameters.
    ``like[i]`` is a view-shaped array of parameter ``i`` (the zeros' dtype and device
    elsewhere).
    """
    outputs: list = [None] * len(plan.params)
    count: dict = {}
    area: dict = {}
    for run in runs:
        for b in run.blocks:
            count[b.param] = count.get(b.param, 0) + 1
            area[b.param] = area.get(b.param, 0) + _area(b)
    # A parameter the runs cover in part (a rank's share of it) is zero elsewhere.
    whole = {i: a == math.prod(plan.params[i].view) for i, a in area.items()}
    pieces = []
    for run, result in zip(runs, results):
        for j, b in enumerate(run.blocks):
            if count[b.param] == 1 and whole[b.param]:
                outputs[b.param] = result[j, ...]
            else:
                pieces.append((b, result[j, ...]))
    if not pieces:
        return outputs
    if not lists.is_foreach(xp):
        for run, result in zip(runs, results):
            if any(count[b.param] > 1 or not whole[b.param] for b in run.blocks):
                for b in run.blocks:
                    if outputs[b.param] is None:
                        outputs[b.param] = xp.zeros(plan.params[b.param].view,
                                                    dtype=result.dtype,
                                                    device=_xp.device_of(result))
                outputs = scatter_blocks(run, result, outputs)
        return outputs
    by_dtype: dict = {}
    for b, block in pieces:
        if b.param not in by_dtype.setdefault(block.dtype, {}):
            by_dtype[block.dtype][b.param] = like[b.param]
    for dtype, members in by_dtype.items():
        sizes = [math.prod(plan.params[i].view) for i in members]
        make = xp.empty if all(whole[i] for i in members) else xp.zeros
        flat = make((sum(sizes),), dtype=dtype,
                    device=_xp.device_of(next(iter(members.values()))))
        start = 0
        for i, size in zip(members, sizes):
            outputs[i] = xp.reshape(flat[start:start + size], plan.params[i].view)
            start += size
    lists.copy_(xp, [outputs[b.param][b.index] for b, _ in pieces],
                [block for _, block in pieces])
    return outputs
