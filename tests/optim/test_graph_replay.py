"""Graph replay of the step between refreshes (matroot/optim/torch/graph_replay.py): the
choice and the fallback on the CPU (with a stand-in capture that replays the step on the
graph's own gradient buffers), and the real CUDA graphs where CUDA is present."""

from __future__ import annotations

import pytest
import torch

from matroot.optim import Shampoo
from matroot.optim.torch.graph_replay import MAX_SIGNATURES, StepGraphs

SHAPES = [(12, 8), (8,), (6, 10), (20, 6)]
OPTIONS = dict(lr=1e-2, block_size=8, precondition_frequency=3, root_method="evd",
               distributed=None, nonfinite_grads="skip")


class _Anywhere(StepGraphs):
    """Replays on the CPU too: the choice of device is tested separately."""

    def wanted(self, device, *, sharded):
        return self.mode is not False and self.off_because is None


def _replaying_capture(step, device):
    """A stand-in for a CUDA capture: nothing runs now, and each replay runs the step
    on the buffers it was captured with, as a graph does."""
    return step


def _failing_capture(step, device):
    raise RuntimeError("operation not permitted when stream is capturing")


def _params(device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(device)) for s in SHAPES]


def _train(opt, params, steps, lrs=None):
    for step in range(steps):
        gen = torch.Generator().manual_seed(10 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.device)
        if step == 4:
            params[0].grad[0, 0] = float("nan")
        if lrs is not None:
            opt.param_groups[0]["lr"] = lrs[step]
        opt.step()


def _pair(capture=None, mode=True, device="cpu"):
    eager_params, replay_params = _params(device), _params(device)
    eager = Shampoo(eager_params, graph_replay=False, **OPTIONS)
    replay = Shampoo(replay_params, graph_replay=mode, **OPTIONS)
    if capture is not None:
        replay.__dict__["_graphs"] = _Anywhere(mode, capture=capture)
    return eager, eager_params, replay, replay_params


def test_on_the_cpu_auto_runs_the_step_eagerly():
    params = _params()
    opt = Shampoo(params, **OPTIONS)
    _train(opt, params, 4)
    assert opt.graphs.mode == "auto" and opt.graphs.replays == 0
    assert opt.graphs.off_because is None


def test_asking_for_replay_where_it_cannot_run_warns_once():
    params = _params()
    opt = Shampoo(params, graph_replay=True, **OPTIONS)
    with pytest.warns(RuntimeWarning, match="CUDA"):
        _train(opt, params, 4)
    assert opt.graphs.replays == 0


def test_a_bad_mode_is_refused():
    with pytest.raises(ValueError, match="graph_replay"):
        Shampoo(_params(), graph_replay="always", **OPTIONS)


def test_replayed_steps_equal_eager_steps_bit_for_bit():
    """The steps between refreshes replay (the first of each signature runs eagerly,
    refreshes always do), reading gradients copied into the graph's buffers."""
    eager, eager_params, replay, replay_params = _pair(_replaying_capture)
    _train(eager, eager_params, 9)
    _train(replay, replay_params, 9)
    for a, b in zip(eager_params, replay_params):
        assert torch.equal(a, b)
    # Steps 1-9: refreshes at 3, 6, 9 run eagerly; step 1 (before preconditioning) and
    # step 4 (after) are the first of their signatures; 2, 5, 7, 8 replay.
    assert replay.graphs.replays == 4
    assert replay.diagnostics()["skipped_steps"] == eager.diagnostics()["skipped_steps"] == 1


def test_a_failed_capture_falls_back_to_eager_for_good():
    eager, eager_params, replay, replay_params = _pair(_failing_capture)
    _train(eager, eager_params, 6)
    with pytest.warns(RuntimeWarning, match="capture failed"):
        _train(replay, replay_params, 6)
    assert replay.graphs.replays == 0 and "capture failed" in replay.graphs.off_because
    for a, b in zip(eager_params, replay_params):
        assert torch.equal(a, b)


def test_an_lr_that_changes_every_step_switches_replay_off():
    lrs = [1e-2 * (1 - 0.05 * k) for k in range(3 * MAX_SIGNATURES + 6)]
    eager, eager_params, replay, replay_params = _pair(_replaying_capture)
    _train(eager, eager_params, len(lrs), lrs)
    with pytest.warns(RuntimeWarning, match="signatures"):
        _train(replay, replay_params, len(lrs), lrs)
    assert replay.graphs.off_because is not None
    for a, b in zip(eager_params, replay_params):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_replay_equals_eager_steps():
    eager, eager_params, replay, replay_params = _pair(mode="auto", device="cuda")
    _train(eager, eager_params, 9)
    _train(replay, replay_params, 9)
    assert replay.graphs.off_because is None and replay.graphs.replays == 4
    for a, b in zip(eager_params, replay_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
