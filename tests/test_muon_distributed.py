"""Muon under torch.distributed (DDP, FSDP2, DTensor, DCP), gloo on CPU.

One process group of 2 and one of 3 ranks (:mod:`spawned_ranks`) run every scenario:
a model sharded with ``fully_shard`` (an embedding and a head, which go to AdamW by
name; hidden layers, one with 10 rows, which neither world size divides; a 3-D stack
of 6 expert matrices, split between owners), a plain parameter and a ``Replicate``
DTensor (mixed), side by side with a single-process ``Muon`` fed the same batches;
and a DDP model whose ranks see different halves of each batch.

What is asserted, and why not more: FSDP2's reduce-scatter and DDP's all-reduce
average gradients, which equal the single process's up to the rounding of that
average, and an owner stacks fewer matrices per polar call than one process does,
which batched kernels may round differently. So parameters agree with one process
to rounding (:data:`ROUNDING_ATOL`), where a matrix factored from a wrong or
misplaced block moves its entries by about ``lr/√n`` ≈ 5e-3 (lr = 0.02, n ≤ 24).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
from spawned_ranks import run_on_ranks

from matroot.optim import Muon

pytest.importorskip("torch.distributed.fsdp")
pytest.importorskip("torch.distributed.tensor")

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


def _rows(p, world, rank):
    from matroot.optim.distributed.muon_owners import row_ranges

    return row_ranges(p.shape[0], world)[rank]


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
    spread = [p for p, flag in zip(params, sharded.row_sharded) if not flag]
    largest = max(sum((b - a) * math.prod(p.shape[1:]) for p in spread
                      for a, b in [_rows(p, world, r)])
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


def _scenarios(rank, world, tmpdir):
    out = {"fsdp": _fsdp_equality(world), "ddp": _ddp_equality(world, rank),
           "dcp": _dcp(world, os.path.dirname(tmpdir)), "mismatch": _mismatch(rank)}
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("muon_dist")


def _run(world, base):
    tmpdir = base / f"world{world}"
    tmpdir.mkdir()
    return run_on_ranks(_scenarios, world, str(tmpdir))


@pytest.fixture(scope="module")
def two_ranks(base):
    return _run(2, base)


@pytest.fixture(scope="module")
def three_ranks(base, two_ranks):
    return _run(3, base)      # after two_ranks: it resumes the 2-rank checkpoint


@pytest.fixture(params=[2, 3], ids=lambda w: f"{w}ranks")
def ranks(request):
    world = request.param
    return world, request.getfixturevalue({2: "two_ranks", 3: "three_ranks"}[world])


def test_fsdp2_and_mixed_parameters_equal_one_process(ranks):
    world, results = ranks
    for rank, r in enumerate(results):
        eq = r["fsdp"]
        # Embedding, head and biases to AdamW, the hidden matrices and the extras to Muon;
        # all of the model's FSDP2 parameters take the row-sharded route.
        assert eq["use_muon"] == [True, False, True] and eq["dtensors"] == 9, f"rank {rank}"
        assert eq["row_sharded"] == 8, f"rank {rank}"
        assert eq["moved"] > 100 * ROUNDING_ATOL     # the run really trained
        assert max(eq["diffs"]) <= ROUNDING_ATOL, f"rank {rank}: {eq['diffs']}"
    # Every matrix has one owner, and every rank owns some (the work is split).
    assert sum(r["fsdp"]["owned"] for r in results) == results[0]["fsdp"]["matrices"] == 12
    assert all(r["fsdp"]["owned"] > 0 for r in results)
    assert all(r["fsdp"]["digest"] == results[0]["fsdp"]["digest"] for r in results)


def test_a_gradient_on_some_ranks_only_raises_on_every_rank(ranks):
    _, results = ranks
    for r in results:
        assert "parameters [1] have a gradient on only some" in r["mismatch"], r["mismatch"]


def test_ddp_ranks_on_batch_shares_equal_one_process_on_the_batch(ranks):
    _, results = ranks
    for rank, r in enumerate(results):
        assert max(r["ddp"]["diffs"]) <= ROUNDING_ATOL, f"rank {rank}: {r['ddp']['diffs']}"
        assert r["ddp"]["steps"] == [STEPS + 1] * 4     # resumed from the state dict


def test_per_rank_state_is_a_world_share_of_one_process_state(ranks):
    """Counted tensor by tensor (a DTensor's local part): each rank keeps the moments
    of its rows of every parameter. The 10-row layer is cut 5/5 and 4/4/2."""
    world, results = ranks
    for rank, r in enumerate(results):
        eq = r["fsdp"]
        assert eq["state_bytes"] <= 1.1 / world * eq["single_state_bytes"], \
            f"rank {rank}: {eq['state_bytes']} of {eq['single_state_bytes']} bytes"


def test_only_the_rows_an_owner_lacks_travel(ranks):
    """Bytes a rank sends in the exchanges with the owners, per step: its rows of the
    matrices others own, and the other ranks' rows of its own matrices, nothing more;
    the whole (plain, Replicate) parameters' updates come back in one all-gather,
    padded to the largest rank's rows."""
    _, results = ranks
    for rank, r in enumerate(results):
        eq = r["fsdp"]
        assert eq["sent"] == eq["expected_sent"] > 0, f"rank {rank}"
        assert eq["gathered"] == eq["expected_gathered"], f"rank {rank}"


def test_dcp_checkpoint_saved_at_two_ranks_resumes_in_one_process(two_ranks, base):
    import torch.distributed.checkpoint as dcp

    from matroot.optim.distributed.muon_checkpoint import load_muon_dcp_state_dict

    assert not dist.is_initialized()
    model = Net()
    opt = Muon(model.named_parameters(), **OPTIONS)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(base / "dcp"))
    model.load_state_dict(state["model"])
    load_muon_dcp_state_dict(opt, str(base / "dcp"))
    _steps(model, opt, SAVED_AT, RESUMED)
    diff = max(float((p.detach() - torch.tensor(q)).abs().max())
               for p, q in zip(model.parameters(), two_ranks[0]["dcp"]))
    assert diff <= ROUNDING_ATOL
    with pytest.raises(ValueError, match="no Muon state under 'optimizer'"):
        load_muon_dcp_state_dict(opt, str(base / "dcp"), key="optimizer")


def _hsdp_scenarios(rank, world, tmpdir):
    return {"hsdp": _fsdp_equality(world, HSDP_MESH)}


#: HSDP: two replicas of a model sharded over two ranks each.
HSDP_MESH = (2, 2)


@pytest.fixture(scope="module")
def hsdp_ranks(base):
    tmpdir = base / "hsdp"
    tmpdir.mkdir()
    return [r["hsdp"] for r in run_on_ranks(_hsdp_scenarios, 4, str(tmpdir))]


def test_hsdp_run_equals_one_process(hsdp_ranks):
    """HSDP (a 2×2 mesh) takes the whole-parameter route: its gradients are made whole,
    its state and matrices are split over all four ranks of the default group."""
    for rank, r in enumerate(hsdp_ranks):
        assert "(Replicate(), Shard(dim=0))" in r["placements"] and r["row_sharded"] == 0
        assert max(r["diffs"]) <= ROUNDING_ATOL, f"rank {rank}: {r['diffs']}"
        # First dimensions of 6 and 10 rows cut in chunks of 2 and 3 over four ranks:
        # rank 0 keeps 1/3 of those parameters' state, not 1/4.
        assert r["state_bytes"] <= 0.3 * r["single_state_bytes"], f"rank {rank}"
    assert all(r["digest"] == hsdp_ranks[0]["digest"] for r in hsdp_ranks)
    assert sum(r["owned"] for r in hsdp_ranks) == hsdp_ranks[0]["matrices"]


def test_dcp_checkpoint_saved_at_two_ranks_resumes_at_three(two_ranks, three_ranks):
    uninterrupted = two_ranks[0]["dcp"]
    assert all(r["dcp"] == uninterrupted for r in two_ranks)
    for rank, r in enumerate(three_ranks):
        diff = max(float((torch.tensor(a) - torch.tensor(b)).abs().max())
                   for a, b in zip(r["dcp"], uninterrupted))
        assert diff <= ROUNDING_ATOL, f"rank {rank}: {diff}"


# Quick tier: the split and the checkpoint format, in this process.


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_rows_are_cut_as_fully_shard_cuts_them_and_every_matrix_has_one_owner(world):
    from matroot.optim.distributed.muon_owners import MatrixOwners, row_ranges

    for rows in range(14):
        chunks = [len(c) for c in torch.arange(rows).chunk(world)] if rows else []
        sizes = [b - a for a, b in row_ranges(rows, world)]
        assert sizes == chunks + [0] * (world - len(chunks)), rows
    shapes = [(24, 8), (10, 24), (6, 8, 8), (12, 6), (16, 2, 3, 3)]
    splits = [1, 1, 1, 3, 1]
    owners = [MatrixOwners(shapes, ["float32"] * 5, splits, world, r) for r in range(world)]
    matrices = owners[0].matrices
    assert all(o.matrices == matrices for o in owners)     # every rank plans alike
    # One matrix per 2-D parameter, six experts, three 4×6 blocks, a conv as 16×18.
    assert [sum(m.param == i for m in matrices) for i in range(5)] == [1, 1, 6, 3, 1]
    assert {(m.param, m.rows[1] - m.rows[0], m.cols) for m in matrices if m.param > 2} == \
        {(3, 4, 6), (4, 16, 18)}
    assert sorted(m.owner for m in matrices) == [m.owner for m in sorted(
        matrices, key=lambda m: (m.owner, m.param, m.rows))]
    if world > 1:
        assert len({m.owner for m in matrices}) > 1


def test_a_checkpoint_of_one_process_resumes_the_same_trajectory(tmp_path):
    """muon_dcp_state_dict / load_muon_dcp_state_dict without a process group."""
    import torch.distributed.checkpoint as dcp

    from matroot.optim.distributed.muon_checkpoint import (load_muon_dcp_state_dict,
                                                           muon_dcp_state_dict)

    torch.manual_seed(0)
    model = Net()
    opt = Muon(model.named_parameters(), distributed=None, **OPTIONS)
    _steps(model, opt, 0, SAVED_AT)
    dcp.save({"model": model.state_dict(), "optim": muon_dcp_state_dict(opt)},
             checkpoint_id=str(tmp_path))
    twin = Net()
    state = {"model": twin.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path))
    twin.load_state_dict(state["model"])
    resumed = Muon(twin.named_parameters(), distributed=None, **OPTIONS)
    load_muon_dcp_state_dict(resumed, str(tmp_path))
    assert [s["step"] for s in resumed.state.values()] == [SAVED_AT] * len(resumed.state)
    _steps(model, opt, SAVED_AT, RESUMED)
    _steps(twin, resumed, SAVED_AT, RESUMED)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="holds state of parameter"):
        load_muon_dcp_state_dict(Muon([("w", torch.nn.Parameter(torch.ones(3, 3)))],
                                      distributed=None), str(tmp_path))
