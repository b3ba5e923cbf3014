"""FSDP2 (``fully_shard``) training with Muon, to run under torchrun.

CPU (gloo)::

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_muon.py

GPUs (NCCL), one process per GPU::

    torchrun --standalone --nproc-per-node 8 examples/fsdp2_muon.py --backend nccl

Each layer and the root are sharded with ``fully_shard``, so every parameter is a
``DTensor`` holding this rank's rows. ``Muon`` keeps the momentum of those rows
only, sends the rows of every hidden matrix to the rank that owns it, which
orthogonalizes its matrices whole (stacked per shape), and gets its rows of the
factors back (docs/polar.rst, "Muon on many ranks"). Rank 0 prints the loss and,
at the end, how far the parameters are from an unsharded run of the same steps.
``--replicas R`` makes it HSDP (R replicas, each sharded over world/R ranks).

Checkpoints with ``torch.distributed.checkpoint``, resumed at another world size::

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_muon.py --save ckpt
    torchrun --standalone --nproc-per-node 3 examples/fsdp2_muon.py --resume ckpt
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

from matroot.optim import Muon
from matroot.optim.distributed.muon_checkpoint import (load_muon_dcp_state_dict,
                                                       muon_dcp_state_dict)


class Model(torch.nn.Module):
    """An embedding and a head (AdamW, by name), three hidden matrices (Muon)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same initial weights on every rank
        self.embed = torch.nn.Embedding(50, 96)
        self.hidden = torch.nn.ModuleList([torch.nn.Linear(4 * 96, 160),
                                           torch.nn.Linear(160, 160),
                                           torch.nn.Linear(160, 160)])
        self.head = torch.nn.Linear(160, 10)

    def forward(self, tokens):
        h = self.embed(tokens).flatten(1)
        for layer in self.hidden:
            h = torch.nn.functional.gelu(layer(h))
        return self.head(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    fsdp2_arguments(parser)
    args, rank, world, device = start(parser, steps=20)
    mesh = fsdp2_mesh(parser, args.replicas, world, device)

    model = Model().to(device)
    reference = Model().to(device) if rank == 0 and not args.resume else None
    for layer in (model.embed, *model.hidden, model.head):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    options = dict(lr=0.02, weight_decay=0.01, adamw_lr=1e-2)
    opt = Muon(model.named_parameters(), **options)
    first = 0
    if args.resume:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=args.resume)
        set_model_state_dict(model, state["model"])
        load_muon_dcp_state_dict(opt, args.resume)
        first = max(int(s["step"]) for s in opt.state.values())
    ref_opt = (Muon(reference.named_parameters(), distributed=None, **options)
               if reference is not None else None)

    train_beside_reference(((reference, ref_opt), (model, opt)), first, args.steps,
                           vocabulary=50, device=device, rank=rank)

    kept = sum((v.to_local() if hasattr(v, "to_local") else v).nbytes
               for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    print(f"rank {rank}/{world}: keeps {kept} bytes of optimizer state", flush=True)
    compare_with_reference(model, reference)
    if args.save:
        dcp.save({"model": get_model_state_dict(model), "optim": muon_dcp_state_dict(opt)},
                 checkpoint_id=args.save)
        if rank == 0:
            print(f"saved {args.save} (step {first + args.steps})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
