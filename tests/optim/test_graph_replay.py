"""Graph replay of the Shampoo step (matroot/optim/torch/graph_replay.py): the choice and
the fallback on the CPU (with a stand-in capture that replays the step on the graph's own
gradient buffers and checks that it rebinds no state tensor, as a graph could not), the
host-read watch that keeps a step that reads the host out of any graph, and the real
CUDA graphs where CUDA is present."""

from __future__ import annotations

import pytest
import torch

from matroot.optim import Shampoo
from matroot.optim.torch import graph_replay
from matroot.optim.torch.graph_replay import MAX_SIGNATURES, StepGraphs, reads_host
from matroot.testing import launch_count
from matroot.testing.launch_count import LaunchCount

SHAPES = [(12, 8), (8,), (6, 10), (20, 6)]
OPTIONS = dict(lr=1e-2, block_size=8, precondition_frequency=3, root_method="coupled_newton",
               distributed=None, nonfinite_grads="skip")


class _Anywhere(StepGraphs):
    """Replays on the CPU too: the choice of device is tested separately."""

    def wanted(self, device, *, sharded):
        return self.mode is not False and self.off_because is None


def _replaying_capture(step, device):
    """A stand-in for a CUDA capture: nothing runs now, and each replay runs the step
    on the buffers it was captured with, as a graph does."""
    return step


def _state_tensors(opt):
    """Every tensor of the optimizer's state: a captured graph reads and writes these
    addresses, so a step must overwrite them, never rebind the state to new ones."""
    out = []
    for family in opt._families:
        for value in family.state:
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, torch.Tensor):
                    out.append(item)
    return out


def _graph_like_capture(opt):
    """A stand-in capture that runs the step at each replay and fails where the step
    leaves the state in other tensors than it found (a graph would write the old ones)."""
    def capture(step, device):
        def replay():
            before = [(id(t), t.data_ptr()) for t in _state_tensors(opt)]
            step()
            after = [(id(t), t.data_ptr()) for t in _state_tensors(opt)]
            assert after == before, "a replayed step rebound the optimizer's state"
        return replay
    return capture


def _failing_capture(step, device):
    raise RuntimeError("operation not permitted when stream is capturing")


def _params(device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(device)) for s in SHAPES]


def _train(opt, params, steps, lrs=None, nan_at=4, first=0):
    for step in range(first, first + steps):
        gen = torch.Generator().manual_seed(10 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.device)
        if step == nan_at:
            params[0].grad[0, 0] = float("nan")
        if lrs is not None:
            opt.param_groups[0]["lr"] = lrs[step]
        opt.step()


def _pair(capture=None, mode=True, device="cpu", **options):
    eager_params, replay_params = _params(device), _params(device)
    options = {**OPTIONS, **options}
    eager = Shampoo(eager_params, graph_replay=False, **options)
    replay = Shampoo(replay_params, graph_replay=mode, **options)
    if capture is not None:
        replay.__dict__["_graphs"] = _Anywhere(mode, capture=capture(replay)
                                               if capture is _graph_like_capture else capture)
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


@pytest.mark.parametrize("capture", [_replaying_capture, _graph_like_capture])
def test_replayed_steps_equal_eager_steps_bit_for_bit(capture):
    """Steps between refreshes and refresh steps replay (the first of each signature
    runs eagerly), reading gradients copied into the graph's buffers and overwriting the
    state where it lies (the roots of a refresh too)."""
    eager, eager_params, replay, replay_params = _pair(capture)
    _train(eager, eager_params, 9)
    _train(replay, replay_params, 9)
    for a, b in zip(eager_params, replay_params):
        assert torch.equal(a, b)
    # Steps 1-9: step 1 (before preconditioning), step 3 (the first refresh) and step 4
    # (between refreshes, preconditioned) are the first of their signatures and run
    # eagerly; 2, 5, 6 (a refresh), 7, 8 and 9 (a refresh) replay.
    assert replay.graphs.replays == 6 and not replay.graphs.eager_because
    assert replay.diagnostics()["skipped_steps"] == eager.diagnostics()["skipped_steps"] == 1
    for a, b in zip(_state_tensors(eager), _state_tensors(replay)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_a_refresh_step_reads_nothing_on_the_host_so_it_is_captured(policy):
    """With the default root options (fixed-step solves, verdicts on the device) the
    device side of a refresh step makes no host read under either policy ("raise"
    reads its gradient screen before it, outside the graph)."""
    params = _params()
    opt = Shampoo(params, **{**OPTIONS, "root_method": "coupled_newton",
                             "nonfinite_grads": policy})
    _train(opt, params, 2)
    for p in params:
        p.grad = torch.randn(p.shape)
    jobs, grads, screen = opt._prepare_step()
    assert jobs[0].schedule == (True, True)
    with LaunchCount() as count:
        assert reads_host(lambda: opt._update(jobs, grads, screen)) is None
    assert count.syncs == 0 and count.ops > 0


@pytest.mark.parametrize("host", [
    dict(nonfinite_grads="raise", root_method="newton_db", root_options={"verdict": "host"}),
    dict(root_method="evd")], ids=["host-verdict", "eigh-checks-its-errors"])
def test_a_step_that_reads_the_host_is_never_captured(host):
    """A refresh whose solve reads the host (its verdict, or an eigh's error codes)
    runs eagerly at every refresh; the steps between refreshes still replay."""
    eager, eager_params, replay, replay_params = _pair(_graph_like_capture, **host)
    _train(eager, eager_params, 9, nan_at=None)
    _train(replay, replay_params, 9, nan_at=None)
    for a, b in zip(eager_params, replay_params):
        assert torch.equal(a, b)
    refresh_kinds = [sig for sig in replay.graphs.eager_because if sig[1][0][1][0]]
    assert len(refresh_kinds) == 1 and len(replay.graphs.eager_because) == 1
    assert replay.graphs.replays == 4        # steps 2, 5, 7, 8
    assert replay.graphs.off_because is None


def test_the_host_read_watch_sees_reads_and_copies_to_the_host():
    assert graph_replay.HOST_SYNCS == launch_count.HOST_SYNCS    # one definition of a sync
    x = torch.ones(3)
    assert reads_host(lambda: x.add_(1)) is None
    assert reads_host(lambda: x.sum().item()) == "_local_scalar_dense"
    assert reads_host(lambda: bool((x > 0).all())) is not None


def test_a_failed_capture_falls_back_to_eager_for_good():
    """The first failed capture (step 2) sends its kind of step to eager; the second
    (step 5, the next kind's) switches replay off."""
    eager, eager_params, replay, replay_params = _pair(_failing_capture)
    _train(eager, eager_params, 6)
    with pytest.warns(RuntimeWarning, match="capture failed"):
        _train(replay, replay_params, 2)
    assert replay.graphs.off_because is None
    assert ["capture failed" in why for why in replay.graphs.eager_because.values()] == [True]
    with pytest.warns(RuntimeWarning, match="capture failed"):
        _train(replay, replay_params, 4, first=2)
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
    assert replay.graphs.off_because is None and replay.graphs.replays == 6
    for a, b in zip(eager_params, replay_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
