"""``matroot.optim.SOAP`` sharded over 2 gloo ranks: the same trajectory as one process,
about half the state per rank, every rank skipping a NaN step together, a checkpoint
mid-run, the same with sgd and adam grafting (a rank's record merged and loaded in one
process retracing the run); and ``write_blocks`` zero where a rank's blocks do not
cover a parameter."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from matroot.optim.shampoo_core.blocking import plan_blocks, subgroup  # noqa: E402
from matroot.optim.shampoo_core.stack_io import write_blocks  # noqa: E402
from spawned_ranks import run_on_ranks  # noqa: E402

SHAPES = [(16, 12), (16, 12), (24, 16), (12,), (3, 40), (16,)]
OPTIONS = dict(lr=0.02, weight_decay=0.1, precondition_frequency=2, block_size=8,
               max_preconditioned_dim=32)
GRAFTING_OPTIONS = dict(OPTIONS, start_preconditioning_step=2)


def _params():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen) for s in SHAPES]


def _set_grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) + 0.3 * p.detach()


def _scenarios(rank, world, tmpdir):
    from matroot.optim import SOAP
    from matroot.optim.soap import state_bytes
    one = [p.clone().requires_grad_() for p in _params()]
    sharded = [p.clone().requires_grad_() for p in _params()]
    single = SOAP(one, distributed=None, nonfinite_grads="skip", **OPTIONS)
    opt = SOAP(sharded, nonfinite_grads="skip", **OPTIONS)
    diffs, saved = [], None
    for step in range(8):
        for params, o in ((one, single), (sharded, opt)):
            _set_grads(params, step)
            if step == 5:
                params[1].grad[0, 0] = float("nan")    # on every rank: all skip it
            o.step()
        diffs.append(max(float((a - b).abs().max()) for a, b in zip(one, sharded)))
        if step == 3:
            buffer = io.BytesIO()
            torch.save(opt.state_dict(), buffer)
            saved = ([p.detach().clone() for p in sharded], buffer.getvalue())
    # The checkpoint at step 4, loaded into a new sharded optimizer, retraces steps 5-8.
    restored = [p.clone().requires_grad_() for p in saved[0]]
    again = SOAP(restored, nonfinite_grads="skip", **OPTIONS)
    again.load_state_dict(torch.load(io.BytesIO(saved[1]), weights_only=False))
    for step in range(4, 8):
        _set_grads(restored, step)
        if step == 5:
            restored[1].grad[0, 0] = float("nan")
        again.step()
    return {"diffs": diffs,
            "restart_diff": max(float((a - b).abs().max()) for a, b in zip(restored, sharded)),
            "bytes": state_bytes(opt._families[0].state)["total"],
            "single_bytes": state_bytes(single._families[0].state)["total"],
            "skipped": opt.diagnostics()["skipped_steps"], "steps": opt.diagnostics()["steps"],
            "params": [p.detach().flatten()[:5].tolist() for p in sharded],
            "grafting": _grafting_scenarios(world)}


def _grafting_scenarios(world):
    """sgd and adam grafting: the single-process trajectory, the grafting moments split
    with the rest of the state, a rank's checkpoint merged and loaded in one process."""
    import torch.distributed as dist

    from matroot.optim import SOAP
    from matroot.optim.distributed.soap_checkpoint import merge_state_dicts
    from matroot.optim.soap import state_bytes
    out = {}
    for grafting in ("sgd", "adam"):
        one = [p.clone().requires_grad_() for p in _params()]
        sharded = [p.clone().requires_grad_() for p in _params()]
        single = SOAP(one, distributed=None, grafting=grafting, **GRAFTING_OPTIONS)
        opt = SOAP(sharded, grafting=grafting, **GRAFTING_OPTIONS)
        diffs, saved = [], None
        for step in range(6):
            for params, o in ((one, single), (sharded, opt)):
                _set_grads(params, step)
                o.step()
            diffs.append(max(float((a - b).abs().max()) for a, b in zip(one, sharded)))
            if step == 2:
                buffer = io.BytesIO()
                torch.save(opt.state_dict(), buffer)
                saved = ([p.detach().clone() for p in sharded], buffer.getvalue())
        # Every rank's record, merged, loaded into one process: it retraces steps 4-6.
        records: list = [None] * world
        dist.all_gather_object(records, saved[1])
        dicts = [torch.load(io.BytesIO(r), weights_only=False) for r in records]
        restored = [p.clone().requires_grad_() for p in saved[0]]
        again = SOAP(restored, distributed=None, grafting=grafting, **GRAFTING_OPTIONS)
        again.load_state_dict(merge_state_dicts(dicts, again._saved_plans(dicts[0])))
        for step in range(3, 6):
            _set_grads(restored, step)
            again.step()
        mine, whole = opt._families[0].state, single._families[0].state
        out[grafting] = {
            "diffs": diffs,
            "restart_diff": max(float((a - b).abs().max()) for a, b in zip(restored, sharded)),
            "grafting_bytes": sum(a.numel() for a in mine.block_graft_exp_avg
                                  + mine.graft_exp_avg if a is not None),
            "single_grafting_bytes": sum(a.numel() for a in whole.block_graft_exp_avg
                                         + whole.graft_exp_avg if a is not None),
            "bytes": state_bytes(mine)["total"],
            "single_bytes": state_bytes(whole)["total"]}
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_on_ranks(_scenarios, 2, str(tmp_path_factory.mktemp("soap2")))


def test_sharded_soap_follows_the_single_process_trajectory(ranks):
    for result in ranks:
        assert max(result["diffs"]) < 1e-5, result["diffs"]
    assert ranks[0]["params"] == ranks[1]["params"]


def test_each_rank_keeps_about_half_the_state(ranks):
    for result in ranks:
        assert result["bytes"] <= 0.6 * result["single_bytes"], result


def test_a_nan_step_is_skipped_on_every_rank(ranks):
    assert all(r["skipped"] == 1 and r["steps"] == 7 for r in ranks)


def test_a_sharded_checkpoint_retraces_the_run(ranks):
    assert all(r["restart_diff"] == 0.0 for r in ranks)


@pytest.mark.parametrize("grafting", ["sgd", "adam"])
def test_sharded_grafting_follows_one_process_and_checkpoints_merge(ranks, grafting):
    for result in (r["grafting"][grafting] for r in ranks):
        assert max(result["diffs"]) < 1e-5, result["diffs"]
        assert result["restart_diff"] < 1e-6, result["restart_diff"]
        assert result["bytes"] <= 0.65 * result["single_bytes"], result


def test_each_rank_keeps_its_share_of_the_grafting_moments(ranks):
    shares = [r["grafting"]["adam"]["grafting_bytes"] for r in ranks]
    assert sum(shares) == ranks[0]["grafting"]["adam"]["single_grafting_bytes"] > 0
    assert all(0 < s < 0.65 * ranks[0]["grafting"]["adam"]["single_grafting_bytes"] for s in shares)
    assert all(r["grafting"]["sgd"]["grafting_bytes"] == 0 for r in ranks)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_write_blocks_is_zero_outside_a_partial_cover(library):
    plan = plan_blocks([(8, 8), (4, 4)], ["float32"] * 2, block_size=4)
    group = plan.groups[0]                       # the five 4x4 blocks
    run = subgroup(group, 1, 3)                  # blocks 1-2 of the (8, 8) parameter
    xp = np if library == "numpy" else torch
    result = xp.ones((2, 4, 4)) if library == "numpy" else torch.ones(2, 4, 4)
    like = [xp.zeros((8, 8)), xp.zeros((4, 4))]
    out = write_blocks(xp if library == "numpy" else __import__(
        "array_api_compat").array_namespace(result), plan, [run], [result], like)
    expected = np.zeros((8, 8))
    expected[0:4, 4:8] = 1
    expected[4:8, 0:4] = 1
    np.testing.assert_array_equal(np.asarray(out[0]), expected)
    assert out[1] is None
