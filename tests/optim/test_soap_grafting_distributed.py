"""SOAP with grafting sharded over 2 gloo ranks: the single-process trajectory, the
grafting moments split with the rest of the state, and a rank's checkpoint merged and
loaded in one process retracing the run."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from spawned_ranks import run_on_ranks  # noqa: E402

SHAPES = [(16, 12), (16, 12), (24, 16), (12,), (3, 40)]
OPTIONS = dict(lr=0.02, weight_decay=0.1, precondition_frequency=2, block_size=8,
               max_preconditioned_dim=32, start_preconditioning_step=2)


def _params():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen) for s in SHAPES]


def _set_grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) + 0.3 * p.detach()


def _scenarios(rank, world, tmpdir):
    import torch.distributed as dist

    from matroot.optim import SOAP
    from matroot.optim.distributed.soap_checkpoint import merge_state_dicts
    from matroot.optim.soap import state_bytes
    out = {}
    for grafting in ("sgd", "adam"):
        one = [p.clone().requires_grad_() for p in _params()]
        sharded = [p.clone().requires_grad_() for p in _params()]
        single = SOAP(one, distributed=None, grafting=grafting, **OPTIONS)
        opt = SOAP(sharded, grafting=grafting, **OPTIONS)
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
        again = SOAP(restored, distributed=None, grafting=grafting, **OPTIONS)
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
    return run_on_ranks(_scenarios, 2, str(tmp_path_factory.mktemp("soap_graft2")))


@pytest.mark.parametrize("grafting", ["sgd", "adam"])
def test_sharded_grafting_follows_one_process_and_checkpoints_merge(ranks, grafting):
    for result in (r[grafting] for r in ranks):
        assert max(result["diffs"]) < 1e-5, result["diffs"]
        assert result["restart_diff"] < 1e-6, result["restart_diff"]
        assert result["bytes"] <= 0.65 * result["single_bytes"], result


def test_each_rank_keeps_its_share_of_the_grafting_moments(ranks):
    shares = [r["adam"]["grafting_bytes"] for r in ranks]
    assert sum(shares) == ranks[0]["adam"]["single_grafting_bytes"] > 0
    assert all(0 < s < 0.65 * ranks[0]["adam"]["single_grafting_bytes"] for s in shares)
    assert all(r["sgd"]["grafting_bytes"] == 0 for r in ranks)
