"""SOAP over ``torch.distributed`` ranks: each rank keeps the state of its share.

The blocks are split as Shampoo's are (:func:`~matroot.optim.distributed.sharding.shard_plan`:
a balanced contiguous run of every group's blocks per rank, each parameter without
factors to one rank; :func:`~matroot.optim.distributed.rank_part.local_plan`: that
share as a plan). A rank keeps the factors, eigenbases and moments of its blocks and
the Adam moments of its unfactored parameters only, so its state is about 1/world of
the whole. Every rank is given the same gradients (data parallel, after their
all-reduce); each computes the directions of its share, zeros elsewhere, and one
all-reduce per dtype sums them, so every rank applies the same update. Decoupled
weight decay is applied by every rank to every parameter, outside the sum.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..distributed.rank_part import local_plan
from ..distributed.sharding import shard_plan
from ..shampoo_core.blocking import BlockPlan

__all__ = ["SoapSharding"]


class SoapSharding:
    """One family's split over the ranks of ``group``, and its update's reduction."""

    def __init__(self, group, plan: BlockPlan):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.split = shard_plan(plan, self.world)
        self.local, _ = local_plan(plan, self.split, self.rank)
        self.elementwise = frozenset(self.split.elementwise_of(self.rank))
        self.owned = frozenset(b.param for g in self.local.groups for b in g.blocks) \
            | self.elementwise

    def local_grads(self, grads) -> list:
        """The gradients of the parameters this rank computes anything for (None elsewhere)."""
        return [g if i in self.owned else None for i, g in enumerate(grads)]

    def summed(self, params, updates) -> list:
        """Every rank's updates (None: zeros) summed over the ranks, one all-reduce per
        dtype; None where the parameter has no gradient."""
        present = [i for i, p in enumerate(params) if p.grad is not None]
        out: list = [None] * len(params)
        by_dtype: dict = {}
        for i in present:
            dtype = torch.float64 if params[i].dtype == torch.float64 else torch.float32
            by_dtype.setdefault(dtype, []).append(i)
        for dtype, members in by_dtype.items():
            flat = torch.cat([(updates[i] if updates[i] is not None else
                               torch.zeros(params[i].shape, dtype=dtype,
                                           device=params[i].device)).reshape(-1)
                              for i in members])
            dist.all_reduce(flat, group=self.group)
            start = 0
            for i in members:
                size = params[i].numel()
                out[i] = flat[start:start + size].view(params[i].shape)
                start += size
        return out
