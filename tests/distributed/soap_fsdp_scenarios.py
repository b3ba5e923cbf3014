"""Rank-side scenarios of ``test_soap_fsdp.py``: the tiny model of :mod:`fsdp_scenarios`
sharded with FSDP2, plus a plain parameter and a ``Replicate`` DTensor, trained with
``matroot.optim.SOAP`` side by side with a single-process SOAP fed the same batches;
a DCP checkpoint saved at 2 ranks and resumed at 3. Module-level functions, so that
the spawned ranks (:mod:`spawned_ranks`) import them.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.tensor import distribute_tensor
from fsdp_scenarios import _digest, _extra_grads, _extras, _local_digest, _loss, _models, _whole
from spawned_ranks import state_dict_bytes

from matroot.optim import SOAP

OPTIONS = dict(lr=0.02, weight_decay=0.01, block_size=4, precondition_frequency=2)
STEPS = 6
SAVED_AT, RESUMED = 3, 3      # DCP: save after 3 steps, then 3 more


def _train(world, options, steps, nan_at=None, rank=0, mesh_shape=None):
    model, reference, mesh = _models(world, mesh_shape)
    extras, twins = _extras(mesh)
    params = [*model.parameters(), *extras]
    ref_params = [*reference.parameters(), *twins]
    opt = SOAP(params, **options)
    ref = SOAP(ref_params, distributed=None, **options)
    diffs = []
    for step in range(steps):
        for o in (opt, ref):
            o.zero_grad()
        _loss(model, step).backward()
        # The single process takes the FSDP2 gradients themselves: a 3-rank average
        # rounds differently from one process, and SOAP's first eigenbases (of rank-
        # deficient factors) turn such rounding into O(lr) moves (docs/soap.rst).
        for p, q in zip(model.parameters(), reference.parameters()):
            q.grad = _whole(p.grad).clone()
        if nan_at == step:    # in rank 0's shard only; the reference sees it too
            reference.hidden.weight.grad[0, 0] = float("nan")
            if rank == 0:
                model.hidden.weight.grad.to_local()[0, 0] = float("nan")
        _extra_grads(extras, step)
        _extra_grads(twins, step)
        opt.step()
        ref.step()
        diffs.append(max(float((_whole(p) - q.detach()).abs().max())
                         for p, q in zip(params, ref_params)))
    return opt, params, {"diffs": diffs,
                         "state_bytes": state_dict_bytes(opt.state_dict()),
                         "single_state_bytes": state_dict_bytes(ref.state_dict()),
                         "digest": _digest([_whole(p) for p in params]),
                         "local_digest": _local_digest(params),
                         "refreshes": opt.diagnostics()["refreshes"],
                         "skipped": opt.diagnostics()["skipped_steps"],
                         "sharded": all(f.sharding is not None for f in opt._families),
                         "placements": sorted({str(p.placements) for p in params
                                               if hasattr(p, "placements")})}


def training(world):
    model, _, _ = _models(world)
    return model, SOAP(list(model.parameters()), **OPTIONS)


def steps(model, opt, start, count):
    for step in range(start, start + count):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()


def _save(base):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from matroot.optim.distributed.checkpoint import dcp_state_dict

    model, opt = training(2)
    steps(model, opt, 0, SAVED_AT)
    dcp.save({"model": get_model_state_dict(model), "optim": dcp_state_dict(opt)},
             checkpoint_id=os.path.join(base, "soap_dcp"))
    steps(model, opt, SAVED_AT, RESUMED)
    return [_whole(p).tolist() for p in model.parameters()]


def _resume(base):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        set_model_state_dict,
    )

    from matroot.optim.distributed.soap_checkpoint import load_soap_dcp_state_dict

    model, opt = training(3)
    path = os.path.join(base, "soap_dcp")
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    load_soap_dcp_state_dict(opt, path)
    steps(model, opt, SAVED_AT, RESUMED)
    return [_whole(p).tolist() for p in model.parameters()]


def _lone_block(world):
    """One 4x4 FSDP2 weight, one block: the other ranks own nothing of its family but
    must still enter the gather of the parameter that L2 decay reads."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1)
    layer, twin = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
    twin.load_state_dict(layer.state_dict())
    fully_shard(layer, mesh=init_device_mesh("cpu", (world,)))
    options = dict(OPTIONS, weight_decay_type="l2", weight_decay=0.1)
    opt = SOAP(layer.parameters(), **options)
    ref = SOAP(twin.parameters(), distributed=None, **options)
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        grad = torch.randn(4, 4, generator=gen)
        twin.weight.grad = grad.clone()
        layer.weight.grad = distribute_tensor(grad, layer.weight.device_mesh,
                                              layer.weight.placements)
        opt.step()
        ref.step()
    owners = sum(f.sharding is not None and bool(f.sharding.owned) for f in opt._families)
    return {"diff": float((_whole(layer.weight) - twin.weight.detach()).abs().max()),
            "owns": owners}


def scenarios(rank, world, tmpdir):
    out = {}
    _, params, out["equality"] = _train(world, OPTIONS, STEPS)
    # L2 decay here: the core reads the parameters, gathered whole on every rank.
    _, _, out["nan_skip"] = _train(world, dict(OPTIONS, nonfinite_grads="skip",
                                               weight_decay_type="l2"), 3, nan_at=1, rank=rank)
    out["lone_block"] = _lone_block(world)
    base = os.path.dirname(tmpdir)
    if world == 2:
        out["uninterrupted"] = _save(base)
    else:
        out["resumed"] = _resume(base)
    dist.barrier()
    return out


#: HSDP: two replicas of the model, each sharded over two ranks (as Shampoo's and Muon's).
HSDP_MESH = (2, 2)


def hsdp_scenarios(rank, world, tmpdir):
    """The equality run on a 2-D mesh: FSDP2's HSDP placements ``(Replicate, Shard(0))``."""
    _, _, out = _train(world, OPTIONS, STEPS, mesh_shape=HSDP_MESH)
    return {"hsdp": out}
