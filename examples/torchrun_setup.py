"""What the torchrun examples share: the process group and device, and for the FSDP2
examples the (HSDP) mesh, the training loop beside an unsharded reference, and the check
against it. Not a script: ``distributed_shampoo.py``, ``fsdp2_shampoo.py`` and
``fsdp2_muon.py`` import it (torchrun puts their folder on ``sys.path``).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def start(parser: argparse.ArgumentParser, steps: int):
    """Parse the command line (with ``--backend`` and ``--steps``), join the process
    group torchrun describes, and return ``(args, rank, world, device)``: a GPU per
    process with NCCL, the CPU with gloo."""
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--steps", type=int, default=steps)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return args, dist.get_rank(), dist.get_world_size(), device


def fsdp2_arguments(parser: argparse.ArgumentParser) -> None:
    """The FSDP2 examples' options: DCP checkpoints and HSDP replicas."""
    parser.add_argument("--save", metavar="DIR", help="save a DCP checkpoint at the end")
    parser.add_argument("--resume", metavar="DIR",
                        help="start from a DCP checkpoint (of any world size)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="HSDP: replicas of the sharded model (must divide the world)")


def fsdp2_mesh(parser: argparse.ArgumentParser, replicas: int, world: int, device):
    """The mesh to ``fully_shard`` over: one axis of every rank, or ``replicas`` × the
    rest (HSDP: each replica sharded over world/replicas ranks)."""
    if replicas < 1 or world % replicas:
        parser.error(f"--replicas {replicas} does not divide the world size {world}")
    if replicas == 1:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (replicas, world // replicas),
                            mesh_dim_names=("replicate", "shard"))


def train_beside_reference(runs, first: int, steps: int, vocabulary: int, device,
                           rank: int) -> None:
    """Train each ``(model, optimizer)`` of ``runs`` (None where a rank has none) on the
    same token batches at steps ``first`` to ``first + steps``; rank 0 prints the loss
    of the last run every five steps."""
    teacher = torch.randn(4, 10, generator=torch.Generator().manual_seed(7)).to(device)
    for step in range(first, first + steps):
        data = torch.Generator().manual_seed(1000 + step)  # the same batch on every rank
        tokens = torch.randint(0, vocabulary, (64, 4), generator=data).to(device)
        target = torch.sin(tokens.float()) @ teacher
        for net, optimizer in runs:
            if net is None or optimizer is None:
                continue
            loss = torch.nn.functional.mse_loss(net(tokens), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)


def compare_with_reference(model, reference) -> None:
    """Print how far the sharded ``model`` is from ``reference`` (an unsharded copy
    trained alike, on rank 0 only: None elsewhere); every rank must call it, as
    gathering the shards is a collective."""
    whole = [p.detach().full_tensor() for p in model.parameters()]
    if reference is not None:
        diff = max(float((w - r.detach()).abs().max())
                   for w, r in zip(whole, reference.parameters()))
        print(f"largest difference from the unsharded run: {diff:.2e}")
