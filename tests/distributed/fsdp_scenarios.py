"""Rank-side scenarios of ``test_fsdp.py``: a tiny model trained under FSDP2 (and HSDP)
side by side with an unsharded copy and a single-process ``Shampoo``, DCP checkpoints
saved at 2 ranks and resumed at 3, each returning what it saw for the tests to check.
A module of its own so that the spawned ranks (:mod:`spawned_ranks`) import it (the
scenarios must be module-level functions) and the test file stays short.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
import torch.distributed as dist
from spawned_ranks import state_dict_bytes

from matroot.optim import Shampoo
from matroot.optim.shampoo_core import core

fsdp = pytest.importorskip("torch.distributed.fsdp")
tensor_api = pytest.importorskip("torch.distributed.tensor")


OPTIONS = dict(lr=0.05, weight_decay=0.01, block_size=4, precondition_frequency=2,
               start_preconditioning_step=2)
STEPS = 6
#: Parameters differ from the single process by rounding only: ~1e-7 differences in
#: a gradient or a root, grown over the steps (measured 7e-7 at 3 ranks); a misplaced update
#: moves a parameter by ~lr = 5e-2.
ROUNDING_ATOL = 1e-5


class Tiny(torch.nn.Module):
    """An embedding, a hidden layer and an output layer: 11x6, 10x6 + 10, 5x10 + 5."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.hidden = torch.nn.Linear(6, 10)
        self.out = torch.nn.Linear(10, 5)

    def forward(self, tokens):
        return self.out(torch.tanh(self.hidden(self.embed(tokens).mean(dim=1))))


def _batch(step):
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 11, (16, 3), generator=gen), torch.randn(16, 5, generator=gen)


def _models(world, mesh_shape=None):
    """An FSDP2 model and its unsharded twin with the same initial weights; a 2-D
    ``mesh_shape`` (replicas, shards) makes it HSDP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference = Tiny()
    sharded = Tiny()
    sharded.load_state_dict(reference.state_dict())
    mesh_shape = mesh_shape or (world,)
    # FSDP2 asks a 2-D (HSDP) mesh for its dimensions' names.
    names = ("replicate", "shard")[-len(mesh_shape):]
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    for layer in (sharded.embed, sharded.hidden, sharded.out):
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    return sharded, reference, mesh


def _extras(mesh):
    """A plain parameter and a ``Replicate`` DTensor, with twins for the reference."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    gen = torch.Generator().manual_seed(7)
    plain, replicated = torch.randn(4, 3, generator=gen), torch.randn(3, 4, generator=gen)
    mine = [torch.nn.Parameter(plain.clone()),
            torch.nn.Parameter(distribute_tensor(replicated.clone(), mesh,
                                                 [Replicate()] * mesh.ndim))]
    twins = [torch.nn.Parameter(plain.clone()), torch.nn.Parameter(replicated.clone())]
    return mine, twins


def _extra_grads(params, step):
    """Gradients of the extra parameters, equal on every rank, as DTensors where needed."""
    from torch.distributed.tensor import DTensor

    gen = torch.Generator().manual_seed(1000 + step)
    for p in params:
        value = p.to_local() if isinstance(p, DTensor) else p.detach()
        grad = 0.3 * value ** 3 + torch.randn(value.shape, generator=gen)
        p.grad = (DTensor.from_local(grad, p.device_mesh, p.placements)
                  if isinstance(p, DTensor) else grad)


def _whole(p):
    from torch.distributed.tensor import DTensor

    return (p.full_tensor() if isinstance(p, DTensor) else p).detach()


def _loss(model, step):
    tokens, target = _batch(step)
    return torch.nn.functional.mse_loss(model(tokens), target)


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def _local_digest(params) -> str:
    """A hash of this rank's own values (its shards, its replicated copies)."""
    from torch.distributed.tensor import DTensor

    return _digest([(p.to_local() if isinstance(p, DTensor) else p).detach() for p in params])


def _train(world, options, steps, nan_at=None, rank=0, mesh_shape=None):
    model, reference, mesh = _models(world, mesh_shape)
    extras, twins = _extras(mesh)
    params = [*model.parameters(), *extras]
    ref_params = [*reference.parameters(), *twins]
    opt = Shampoo(params, **options)
    ref = Shampoo(ref_params, distributed=None, **options)
    diffs, outcomes = [], []
    for step in range(steps):
        for o in (opt, ref):
            o.zero_grad()
        _loss(model, step).backward()
        _loss(reference, step).backward()
        _extra_grads(extras, step)
        _extra_grads(twins, step)
        if nan_at == step:
            # The single process sees the NaN too: a skipped step counts in the schedule
            # (docs/optimizer.rst, "One rule for a skipped step"), so a reference that
            # merely left the step out would drift from it at the next refresh.
            ref_params[0].grad[0, 0] = float("nan")
            if rank == 0:
                local = model.hidden.weight.grad.to_local()
                if local.numel():
                    local[0, 0] = float("nan")
                else:
                    extras[0].grad[0, 0] = float("nan")
        try:
            opt.step()
            outcomes.append("stepped")
        except core.NonFiniteGradientError:
            outcomes.append("raised")
        try:
            ref.step()
        except core.NonFiniteGradientError:
            pass
        diffs.append(max(float((_whole(p) - q.detach()).abs().max())
                         for p, q in zip(params, ref_params)))
    return opt, params, {"diffs": diffs, "outcomes": outcomes,
                         "state_bytes": state_dict_bytes(opt.state_dict()),
                         "single_state_bytes": state_dict_bytes(ref.state_dict()),
                         "step_counters": len(opt.state),
                         "digest": _digest([_whole(p) for p in params]),
                         "local_digest": _local_digest(params),
                         "replicated_digest": _local_digest(extras),
                         "skipped": opt.diagnostics()["skipped_steps"],
                         "refreshes": opt.diagnostics()["root_refreshes"]}


SAVED_AT, RESUMED = 3, 3      # DCP: save after 3 steps, then 3 more


def _fsdp_training(world, start=0):
    model, _, _ = _models(world)
    return model, Shampoo(list(model.parameters()), **OPTIONS)


def _steps(model, opt, start, count):
    for step in range(start, start + count):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()


def _scenario_dcp_save(base):
    """Two ranks: save a checkpoint after SAVED_AT steps, then the uninterrupted run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from matroot.optim.distributed.checkpoint import dcp_state_dict

    model, opt = _fsdp_training(2)
    _steps(model, opt, 0, SAVED_AT)
    dcp.save({"model": get_model_state_dict(model), "optim": dcp_state_dict(opt)},
             checkpoint_id=os.path.join(base, "dcp"))
    # Two broken checkpoints: one rank's entry unreadable, one rank's entry missing.
    entry = dcp_state_dict(opt)
    if dist.get_rank() == 1:
        entry = {name: b"not a state dict" for name in entry}
    dcp.save({"optim": entry}, checkpoint_id=os.path.join(base, "garbled"))
    dcp.save({"optim": dcp_state_dict(opt) if dist.get_rank() == 0 else {}},
             checkpoint_id=os.path.join(base, "incomplete"))
    _steps(model, opt, SAVED_AT, RESUMED)
    return [_whole(p).tolist() for p in model.parameters()]


def _resume_from_dcp(model, opt, path):
    """Load model and optimizer from the 2-rank checkpoint and take the remaining steps."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        set_model_state_dict,
    )

    from matroot.optim.distributed.checkpoint import load_dcp_state_dict

    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    load_dcp_state_dict(opt, path)
    _steps(model, opt, SAVED_AT, RESUMED)
    return [_whole(p).tolist() for p in model.parameters()]


def _scenario_dcp_load(base):
    """Three ranks: resume the 2-rank checkpoint; broken checkpoints give clear errors."""
    from matroot.optim.distributed.checkpoint import load_dcp_state_dict

    out = {"resumed": _resume_from_dcp(*_fsdp_training(3), os.path.join(base, "dcp"))}
    model, _ = _fsdp_training(3)
    cases = {"garbled": Shampoo(list(model.parameters()), **OPTIONS),
             "incomplete": Shampoo(list(model.parameters()), **OPTIONS),
             "dcp": Shampoo(list(model.parameters())[:-1], **OPTIONS)}  # another model
    for name, opt in cases.items():
        try:
            load_dcp_state_dict(opt, os.path.join(base, name))
            out[f"error_{name}"] = "loaded"
        except ValueError as err:
            out[f"error_{name}"] = str(err)
    return out


def _scenarios(rank, world, tmpdir):
    from torch.distributed.tensor import DTensor

    out = {}
    opt, params, out["equality"] = _train(world, OPTIONS, STEPS)
    out["equality"]["dtensors"] = sum(isinstance(p, DTensor) for p in params)
    out["equality"]["sharded"] = opt._families[0].sharding is not None
    out["equality"]["shard_rows"] = [list(p.to_local().shape) for p in params
                                     if isinstance(p, DTensor)]
    for policy in ("raise", "skip"):
        _, _, out[f"nan_{policy}"] = _train(world, dict(OPTIONS, nonfinite_grads=policy), 4,
                                            nan_at=2, rank=rank)
    base = os.path.dirname(tmpdir)
    if world == 2:
        out["uninterrupted"] = _scenario_dcp_save(base)
    else:
        out["dcp"] = _scenario_dcp_load(base)
    dist.barrier()
    return out


#: HSDP: two replicas of a model sharded over two ranks each.
HSDP_MESH = (2, 2)


def _hsdp_scenarios(rank, world, tmpdir):
    from torch.distributed.tensor import DTensor

    opt, params, out = _train(world, OPTIONS, STEPS, mesh_shape=HSDP_MESH)
    out["sharded"] = opt._families[0].sharding is not None
    out["placements"] = sorted({str(p.placements) for p in params if isinstance(p, DTensor)})
    return {"hsdp": out}
