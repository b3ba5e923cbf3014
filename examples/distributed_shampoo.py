"""Data-parallel training with sharded Shampoo, to run under torchrun.

CPU (gloo)::

    torchrun --standalone --nproc-per-node 2 examples/distributed_shampoo.py

GPUs (NCCL), one process per GPU::

    torchrun --standalone --nproc-per-node 8 examples/distributed_shampoo.py --backend nccl

DDP averages the gradients; ``Shampoo`` sees that ``torch.distributed`` is up,
keeps factors and inverse roots only for the blocks of this rank, and shares the
updates with one all-gather per block shape. At the end every rank saves its
shard, and rank 0 checks that the parameters agree on all ranks.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torchrun_setup import start

from matroot.optim import Shampoo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", default=None,
                        help="save every rank's optimizer shard here")
    args, rank, world, device = start(parser, steps=30)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(96, 160), torch.nn.GELU(), torch.nn.Linear(160, 160), torch.nn.GELU(),
        torch.nn.Linear(160, 10)).to(device)
    ddp = DistributedDataParallel(model)
    opt = Shampoo(model.parameters(), lr=1e-2, block_size=64, precondition_frequency=5)

    data = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
    teacher = torch.randn(96, 10, generator=torch.Generator().manual_seed(7)).to(device)
    for step in range(args.steps):
        x = torch.randn(64, 96, generator=data).to(device)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ teacher)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

    sharding = opt._families[0].sharding
    stats = opt.diagnostics()
    print(f"rank {rank}/{world}: {stats['blocks']} of {sharding.plan.num_blocks} blocks, "
          f"optimizer state {stats['state_bytes']} bytes", flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    if rank == 0:
        same = all(torch.equal(flat, c) for c in copies)
        print(f"parameters identical on all {world} ranks: {same}")

    if args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()},
                   os.path.join(args.checkpoint_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
