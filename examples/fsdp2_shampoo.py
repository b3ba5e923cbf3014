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
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from matroot.optim import Shampoo


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(
        torch.nn.Embedding(1000, 96), torch.nn.Flatten(), torch.nn.Linear(4 * 96, 160),
        torch.nn.GELU(), torch.nn.Linear(160, 10))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    model = build_model().to(device)
    reference = build_model().to(device) if rank == 0 else None
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    options = dict(lr=1e-2, block_size=64, precondition_frequency=5)
    opt = Shampoo(model.parameters(), **options)
    ref_opt = Shampoo(reference.parameters(), distributed=None, **options) if reference else None

    data = torch.Generator().manual_seed(1)  # the same batches on every rank
    teacher = torch.randn(4, 10, generator=torch.Generator().manual_seed(7)).to(device)
    for step in range(args.steps):
        tokens = torch.randint(0, 1000, (64, 4), generator=data).to(device)
        target = torch.sin(tokens.float()) @ teacher
        for net, optimizer in ((model, opt), (reference, ref_opt)):
            if net is None:
                continue
            loss = torch.nn.functional.mse_loss(net(tokens), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

    stats = opt.diagnostics()
    print(f"rank {rank}/{world}: {stats['blocks']} blocks, optimizer state "
          f"{stats['state_bytes']} bytes", flush=True)
    whole = [p.full_tensor() for p in model.parameters()]  # a collective: every rank
    if reference is not None:
        diff = max(float((w - r.detach()).abs().max())
                   for w, r in zip(whole, reference.parameters()))
        print(f"largest difference from the unsharded run: {diff:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
