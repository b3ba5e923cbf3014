"""FSDP2 (``fully_shard``) training with Shampoo, to run under torchrun.

CPU (gloo)::

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_shampoo.py

GPUs (NCCL), one process per GPU::

    torchrun --standalone --nproc-per-node 8 examples/fsdp2_shampoo.py --backend nccl

Each layer and the root are sharded with ``fully_shard``, so every parameter is
a ``DTensor`` holding this rank's rows. ``Shampoo`` gathers each gradient whole,
updates the blocks this rank owns, shares the updates with one all-gather per
dtype and adds this rank's rows to its shards: the result does not depend on the
world size (docs/distributed.rst, "FSDP2"). Rank 0 prints the loss and, at the
end, how far the parameters are from an unsharded run of the same steps.

HSDP (``--replicas R``: a 2-D mesh of R replicas, each sharded over world/R ranks;
the blocks are split over all ranks, the result is the same)::

    torchrun --standalone --nproc-per-node 4 examples/fsdp2_shampoo.py --replicas 2

Checkpoints with ``torch.distributed.checkpoint``, resumed at another world size::

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_shampoo.py --save ckpt
    torchrun --standalone --nproc-per-node 3 examples/fsdp2_shampoo.py --resume ckpt
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import fully_shard
from torchrun_setup import (compare_with_reference, fsdp2_arguments, fsdp2_mesh, start,
                           train_beside_reference)

from matroot.optim import Shampoo
from matroot.optim.distributed.checkpoint import dcp_state_dict, load_dcp_state_dict


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(
        torch.nn.Embedding(1000, 96), torch.nn.Flatten(), torch.nn.Linear(4 * 96, 160),
        torch.nn.GELU(), torch.nn.Linear(160, 10))


def main() -> None:
    parser = argparse.ArgumentParser()
    fsdp2_arguments(parser)
    args, rank, world, device = start(parser, steps=20)
    mesh = fsdp2_mesh(parser, args.replicas, world, device)

    model = build_model().to(device)
    reference = build_model().to(device) if rank == 0 else None
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    options = dict(lr=1e-2, block_size=64, precondition_frequency=5)
    opt = Shampoo(model.parameters(), **options)
    if args.resume:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=args.resume)
        set_model_state_dict(model, state["model"])
        load_dcp_state_dict(opt, args.resume)
        reference = None      # the unsharded comparison starts from the initial weights
    ref_opt = (Shampoo(reference.parameters(), distributed=None, **options)
               if reference is not None else None)

    first = opt.diagnostics()["steps"]        # > 0 after --resume
    train_beside_reference(((reference, ref_opt), (model, opt)), first, args.steps,
                           vocabulary=1000, device=device, rank=rank)

    stats = opt.diagnostics()
    print(f"rank {rank}/{world}: {stats['blocks']} blocks, optimizer state "
          f"{stats['state_bytes']} bytes", flush=True)
    compare_with_reference(model, reference)
    if args.save:
        dcp.save({"model": get_model_state_dict(model), "optim": dcp_state_dict(opt)},
                 checkpoint_id=args.save)
        if rank == 0:
            print(f"saved {args.save} (steps {opt.diagnostics()['steps']})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
