"""The scenarios of tests/distributed/test_muon_distributed.py, run on every spawned rank.

Every rank trains the same models side by side with a single-process ``Muon`` and
returns what the tests assert (module docstring of the test file: what and why).
"""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist

from matroot.optim import Muon

OPTIONS = dict(lr=0.02, weight_decay=0.1, adamw_lr=3e-3, adamw_weight_decay=0.01)
STEPS = 5
#: Rounding of an averaged gradient and of a smaller batched polar call, grown over the
#: steps; a wrong block moves a parameter by ~5e-3.
ROUNDING_ATOL = 2e-5
SAVED_AT, RESUMED = 3, 3


class Net(torch.nn.Module):
    """embed 12×8 and head 6×24 (AdamW by name), hidden 24×8 and 10×24 (Muon), experts
    6×8×8 (Muon, a stack of six), biases (AdamW)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(12, 8)
        self.hidden = torch.nn.Linear(8, 24)
        self.narrow = torch.nn.Linear(24, 10)
        self.experts = torch.nn.Parameter(torch.randn(6, 8, 8) / 3)
        self.head = torch.nn.Linear(10, 6)

    def forward(self, tokens):
        h = torch.tanh(self.hidden(self.embed(tokens).mean(dim=1)))
        mixed = torch.einsum("bi,eoi->bo", h[:, :8], self.experts)
        return self.head(torch.tanh(self.narrow(h))) + mixed[:, :6]


def _batch(step, rows=slice(None)):
    gen = torch.Generator().manual_seed(100 + step)
    tokens, target = torch.randint(0, 12, (16, 3), generator=gen), torch.randn(16, 6,
                                                                               generator=gen)
    return tokens[rows], target[rows]


def _loss(model, step, rows=slice(None)):
    tokens, target = _batch(step, rows)
    return torch.nn.functional.mse_loss(model(tokens), target)


def _whole(p):
    from torch.distributed.tensor import DTensor

    return (p.full_tensor() if isinstance(p, DTensor) else p).detach()


def _local_bytes(state) -> int:
    """Bytes of a rank's own state tensors (a DTensor's local part)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for entry in state.values():
        for value in entry.values():
            if isinstance(value, DTensor):
                value = value.to_local()
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
    return total


def _fsdp_model(world, mesh_shape=None):
    """An FSDP2 model and its unsharded twin; a 2-D ``mesh_shape`` (replicas, shards)
    makes it HSDP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference, sharded = Net(), Net()
    sharded.load_state_dict(reference.state_dict())
    mesh_shape = mesh_shape or (world,)
    mesh = init_device_mesh("cpu", mesh_shape,
                            mesh_dim_names=("replicate", "shard")[-len(mesh_shape):])
    for layer in (sharded.embed, sharded.hidden, sharded.narrow, sharded.head):
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    return sharded, reference, mesh


def _extras(mesh):
    """A plain (12, 6) and a ``Replicate`` (6, 12) matrix, named for Muon, and twins."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    gen = torch.Generator().manual_seed(7)
    plain, replicated = torch.randn(12, 6, generator=gen), torch.randn(6, 12, generator=gen)
    mine = [("extra.plain", torch.nn.Parameter(plain.clone())),
            ("extra.replicated", torch.nn.Parameter(
                distribute_tensor(replicated.clone(), mesh, [Replicate()] * mesh.ndim)))]
    twins = [(n, torch.nn.Parameter(t.clone())) for n, t in
             zip(("extra.plain", "extra.replicated"), (plain, replicated))]
    return mine, twins


def _extra_grads(named, step):
    from torch.distributed.tensor import DTensor

    gen = torch.Generator().manual_seed(1000 + step)
    for _, p in named:
        value = _whole(p)
        grad = 0.3 * value ** 3 + torch.randn(value.shape, generator=gen)
        p.grad = (DTensor.from_local(grad, p.device_mesh, p.placements)
                  if isinstance(p, DTensor) else grad)


def _groups(named, extras):
    """The model and the ``Replicate`` extra split by the rule; the plain extra in a
    Muon group of its own, cut into 3 blocks of 4 rows (a fused QKV's ``split``)."""
    return [{"params": [*named, extras[1]]}, {"params": [extras[0][1]], "use_muon": True,
                                               "split": 3}]


def _flags(opt):
    return [g["use_muon"] for g in opt.param_groups for _ in g["params"]]


def _fsdp_equality(world, mesh_shape=None):
    from torch.distributed.tensor import DTensor

    model, reference, mesh = _fsdp_model(world, mesh_shape)
    extras, twins = _extras(mesh)
    opt = Muon(_groups(list(model.named_parameters()), extras), **OPTIONS)
    ref = Muon(_groups(list(reference.named_parameters()), twins), distributed=None, **OPTIONS)
    params = [p for g in opt.param_groups for p in g["params"]]
    ref_params = [p for g in ref.param_groups for p in g["params"]]
    initial = [q.detach().clone() for q in ref_params]
    diffs = []
    for step in range(STEPS):
        opt.zero_grad()
        ref.zero_grad()
        _loss(model, step).backward()
        _loss(reference, step).backward()
        _extra_grads(extras, step)
        _extra_grads(twins, step)
        opt.step()
        ref.step()
        diffs.append(max(float((_whole(p) - q.detach()).abs().max())
                         for p, q in zip(params, ref_params)))
    sharded = opt._sharded
    o = sharded.owners
    # To the owners: this rank's rows of others' matrices; back: others' rows of its own.
    expected = 4 * sum(o._elements(m, o.rank) if m.owner != o.rank else
                       sum(o._elements(m, r) for r in range(world) if r != o.rank)
                       for m in o.matrices)
    spread = [i for i, flag in enumerate(sharded.row_sharded) if not flag]
    largest = max(sum(math.prod(sharded.part_shape(i, params[i].shape, r)) for i in spread)
                  for r in range(world))
    return {"sent": o.sent_bytes / STEPS, "expected_sent": expected,
            "gathered": sharded.gathered_bytes / STEPS, "expected_gathered": 4 * world * largest,
            "muon_elements": sum(p.numel() for p, u in zip(params, _flags(opt)) if u),
            "diffs": diffs, "use_muon": [g["use_muon"] for g in opt.param_groups],
            "placements": sorted({str(p.placements) for p in params if isinstance(p, DTensor)}),
            "row_sharded": sum(sharded.row_sharded),
            "dtensors": sum(isinstance(p, DTensor) for p in params),
            "owned": len([m for m in sharded.owners.matrices if m.owner == sharded.rank]),
            "matrices": len(sharded.owners.matrices),
            "state_bytes": _local_bytes(opt.state),
            "single_state_bytes": _local_bytes(ref.state),
            "moved": max(float((q.detach() - q0).abs().max())
                         for q, q0 in zip(ref_params, initial)),
            "digest": [_whole(p).tolist() for p in params]}


def _ddp_equality(world, rank):
    """A DDP model whose ranks each see their share of the batch, against one process
    on the whole batch."""
    torch.manual_seed(1)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.Tanh(),
                                    torch.nn.Linear(24, 10))
    local = torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.Tanh(), torch.nn.Linear(24, 10))
    local.load_state_dict(reference.state_dict())
    model = torch.nn.parallel.DistributedDataParallel(local)
    opt = Muon(model.named_parameters(), **OPTIONS)
    ref = Muon(reference.named_parameters(), distributed=None, **OPTIONS)
    share = 24 // world
    diffs = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(24, 8, generator=gen), torch.randn(24, 10, generator=gen)
        for o in (opt, ref):
            o.zero_grad()
        rows = slice(rank * share, (rank + 1) * share)
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        opt.step()
        ref.step()
        diffs.append(max(float((p - q).abs().max()) for p, q in
                         zip(local.parameters(), reference.parameters())))
    # The single process's state dict, given to a sharded Muon: each rank keeps its rows.
    resumed = Muon(local.named_parameters(), **OPTIONS)
    resumed.load_state_dict(ref.state_dict())
    for o in (resumed, ref):
        o.zero_grad()
    torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    resumed.step()
    ref.step()
    diffs.append(max(float((p - q).abs().max()) for p, q in
                     zip(local.parameters(), reference.parameters())))
    return {"diffs": diffs, "steps": [s["step"] for s in resumed.state.values()]}


def _steps(model, opt, start, count):
    for step in range(start, start + count):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()


def _dcp(world, base):
    """Two ranks save after SAVED_AT steps and go on; three ranks resume the checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         set_model_state_dict)

    from matroot.optim.distributed.muon_checkpoint import (load_muon_dcp_state_dict,
                                                           muon_dcp_state_dict)

    model, _, _ = _fsdp_model(world)
    opt = Muon(model.named_parameters(), **OPTIONS)
    path = os.path.join(base, "dcp")
    if world == 2:
        _steps(model, opt, 0, SAVED_AT)
        dcp.save({"model": get_model_state_dict(model), "optim": muon_dcp_state_dict(opt)},
                 checkpoint_id=path)
    else:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(model, state["model"])
        load_muon_dcp_state_dict(opt, path)
    _steps(model, opt, SAVED_AT, RESUMED)
    return [_whole(p).tolist() for p in model.parameters()]


def _mismatch(rank):
    """A parameter with a gradient on rank 0 only: every rank raises, none hangs."""
    from matroot.optim.distributed.core import GradientMismatchError

    a, b = torch.nn.Parameter(torch.ones(4, 4)), torch.nn.Parameter(torch.eye(4))
    opt = Muon([("w.a", a), ("w.b", b)])
    a.grad = torch.ones(4, 4)
    if rank == 0:
        b.grad = torch.ones(4, 4)
    try:
        opt.step()
    except GradientMismatchError as err:
        return str(err)
    return "stepped"


#: Small first dimensions: whole (plain) Muon matrices and AdamW biases, and one
#: ``fully_shard`` (3, 512) weight, whose rows FSDP2 cuts (on a 1-D mesh).
SMALL_SHAPES = {"a.weight": (3, 512), "b.weight": (5, 64), "c.weight": (3, 8, 8),
                "d.weight": (2, 3), "a.bias": (3,), "b.bias": (5,), "c.bias": (7,)}
SMALL_STEPS, SMALL_SAVED_AT = 4, 2


def _small_model(world, mesh_shape=None):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    gen = torch.Generator().manual_seed(5)
    values = {n: torch.randn(s, generator=gen) for n, s in SMALL_SHAPES.items()}
    torch.manual_seed(2)
    layer = torch.nn.Linear(512, 3, bias=False)
    named = [(n, torch.nn.Parameter(v)) for n, v in values.items()]
    if world > 1:
        mesh_shape = mesh_shape or (world,)
        fully_shard(layer, mesh=init_device_mesh(
            "cpu", mesh_shape, mesh_dim_names=("replicate", "shard")[-len(mesh_shape):]))
    return named + [("fsdp.weight", layer.weight)], layer


def _small_step(named, layer, opt, step):
    gen = torch.Generator().manual_seed(50 + step)
    for _, p in named[:-1]:
        p.grad = torch.randn(p.shape, generator=gen)
    layer(torch.randn(4, 512, generator=gen)).square().sum().backward()
    opt.step()
    opt.zero_grad()


def _small_first_dims(world, mesh_shape=None, base=None):
    """Per-rank state of parameters whose first dimension is small against the world,
    trained beside one process fed the same gradients; at 2 ranks a DCP checkpoint
    saved midway, which 3 ranks resume."""
    import torch.distributed.checkpoint as dcp

    from matroot.optim.distributed.muon_checkpoint import (load_muon_dcp_state_dict,
                                                           muon_dcp_state_dict)

    named, layer = _small_model(world, mesh_shape)
    twins, twin_layer = _small_model(1)
    opt = Muon(named, **OPTIONS)
    ref = Muon(twins, distributed=None, **OPTIONS)
    diffs = []
    for step in range(SMALL_STEPS):
        _small_step(named, layer, opt, step)
        _small_step(twins, twin_layer, ref, step)
        diffs.append(max(float((_whole(p) - q.detach()).abs().max())
                         for (_, p), (_, q) in zip(named, twins)))
        if base is not None and world == 2 and step + 1 == SMALL_SAVED_AT:
            dcp.save({"params": {n: p.detach() for n, p in named},
                      "optim": muon_dcp_state_dict(opt)},
                     checkpoint_id=os.path.join(base, "small_dcp"))

    def state_bytes(o, params):
        return _local_bytes({p: o.state[p] for p in params})

    out = {"diffs": diffs,
           "state": state_bytes(opt, [p for _, p in named]),
           "single_state": state_bytes(ref, [q for _, q in twins]),
           "fsdp": state_bytes(opt, [layer.weight]),
           "single_fsdp": state_bytes(ref, [twin_layer.weight]),
           "layout": [None if part is None else [part.dim, part.holder]
                      for part in opt._sharded.layout]}
    if base is not None and world == 3:
        named, layer = _small_model(world)
        opt = Muon(named, **OPTIONS)
        path = os.path.join(base, "small_dcp")
        params = {n: p.detach() for n, p in named}
        dcp.load({"params": params}, checkpoint_id=path)
        load_muon_dcp_state_dict(opt, path)
        for step in range(SMALL_SAVED_AT, SMALL_STEPS):
            _small_step(named, layer, opt, step)
        out["resumed"] = max(float((_whole(p) - q.detach()).abs().max())
                             for (_, p), (_, q) in zip(named, twins))
        out["resumed_layout"] = [None if part is None else [part.dim, part.holder]
                                 for part in opt._sharded.layout]
    return out


def _scenarios(rank, world, tmpdir):
    out = {"fsdp": _fsdp_equality(world), "ddp": _ddp_equality(world, rank),
           "dcp": _dcp(world, os.path.dirname(tmpdir)), "mismatch": _mismatch(rank),
           "small": _small_first_dims(world, base=os.path.dirname(tmpdir))}
    dist.barrier()
    return out


def _hsdp_scenarios(rank, world, tmpdir):
    return {"hsdp": _fsdp_equality(world, HSDP_MESH),
            "small": _small_first_dims(world, HSDP_MESH)}


#: HSDP: two replicas of a model sharded over two ranks each.
HSDP_MESH = (2, 2)
