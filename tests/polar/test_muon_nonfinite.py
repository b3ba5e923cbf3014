"""Muon's ``nonfinite_grads``: a NaN/Inf gradient raises (the default) or skips the step,
as Shampoo's and SOAP's do, in the torch shell (one process and sharded) and the optax
shell (eagerly and under jax.jit). Before it, a NaN gradient was written into the
parameters without a word."""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from matroot.optim import Muon  # noqa: E402
from matroot.optim.shampoo_core.config import NonFiniteGradientError  # noqa: E402

from hang_guard import HANG_GUARD_S  # noqa: E402


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _gradients(model, seed, bad=None):
    """Seeded gradients; ``bad = (parameter number, value)`` poisons one entry."""
    generator = torch.Generator().manual_seed(seed)
    for number, p in enumerate(model.parameters()):
        p.grad = torch.randn(p.shape, generator=generator)
        if bad is not None and bad[0] == number:
            p.grad.view(-1)[1] = bad[1]


def _snapshot(model, opt):
    return ([p.detach().clone() for p in model.parameters()], copy.deepcopy(opt.state_dict()))


def _same(a, b):
    (params_a, state_a), (params_b, state_b) = a, b
    assert all(torch.equal(x, y) for x, y in zip(params_a, params_b))
    for number, entries in state_a["state"].items():
        for key, value in entries.items():
            other = state_b["state"][number][key]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other


@pytest.mark.parametrize("number, value", [(0, float("nan")), (1, float("inf")),
                                           (2, -float("inf"))])
def test_a_nonfinite_gradient_raises_by_default_naming_it_and_changes_nothing(number, value):
    """Model parameter 0 is a Muon matrix, 1 its bias (AdamW), 2 the last layer's matrix
    (Muon): either half, named by its number in ``state_dict`` (groups' order)."""
    model = _model()
    opt = Muon(model.named_parameters(), lr=0.02, adamw_lr=1e-3)
    ordered = [id(p) for group in opt.param_groups for p in group["params"]]
    saved_number = ordered.index(id(list(model.parameters())[number]))
    _gradients(model, 0)
    opt.step()
    before = _snapshot(model, opt)
    _gradients(model, 1, bad=(number, value))
    with pytest.raises(NonFiniteGradientError,
                       match=rf"parameters \[{saved_number}\] \(state_dict.*'skip'"):
        opt.step()
    _same(before, _snapshot(model, opt))


def test_skip_leaves_no_trace_and_counts_the_step():
    """A run with a skipped NaN step in the middle equals the run without that step."""
    runs = []
    for poisoned in (False, True):
        model = _model()
        opt = Muon(model.named_parameters(), lr=0.02, adamw_lr=1e-3, nonfinite_grads="skip")
        for seed in range(4):
            if poisoned and seed == 2:
                _gradients(model, 99, bad=(0, float("nan")))
                opt.step()
            _gradients(model, seed)
            opt.step()
        runs.append((_snapshot(model, opt), opt.skipped_steps))
    _same(runs[0][0], runs[1][0])
    assert (runs[0][1], runs[1][1]) == (0, 1)


def test_an_unknown_policy_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"nonfinite_grads.*'raise', 'skip'"):
        Muon(_model().named_parameters(), nonfinite_grads="ignore")


def test_optax_muon_raises_eagerly_and_skips_under_jit():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from matroot.optim.optax import muon

    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    grads = {"w": jnp.full((4, 3), 0.5), "b": jnp.ones(3)}
    bad = {"w": grads["w"].at[0, 1].set(jnp.nan), "b": grads["b"]}
    opt = muon(0.05)
    state = opt.update(grads, opt.init(params), params)[1]
    with pytest.raises(NonFiniteGradientError, match=r"parameters \[1\] \(pytree leaf order\)"):
        opt.update(bad, state, params)     # leaves sorted by key: b, w
    skip = muon(0.05, nonfinite_grads="skip")
    for update in (jax.jit(opt.update), skip.update, jax.jit(skip.update)):
        updates, after = update(bad, state, params)
        assert all(np.all(np.asarray(u) == 0) for u in jax.tree_util.tree_leaves(updates))
        for was, now in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(after)):
            np.testing.assert_array_equal(np.asarray(was), np.asarray(now))


def test_the_sharded_step_agrees_on_the_policy(tmp_path):
    """A world of one through the sharded step (DTensor parameters): the same rule."""
    script = f"""
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from matroot.optim import Muon
from matroot.optim.shampoo_core.config import NonFiniteGradientError
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
try:
    mesh = init_device_mesh("cpu", (1,))
    weight = torch.nn.Parameter(distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)]))
    for policy in ("raise", "skip"):
        opt = Muon([("w", weight)], nonfinite_grads=policy)
        grad = torch.ones(8, 4)
        grad[3, 1] = float("nan")
        weight.grad = distribute_tensor(grad, mesh, [Shard(0)])
        try:
            opt.step()
            print(policy, "skipped", opt.skipped_steps, bool(torch.equal(weight.full_tensor(),
                                                                          torch.ones(8, 4))))
        except NonFiniteGradientError as error:
            print(policy, "raised", "[0]" in str(error))
finally:
    dist.destroy_process_group()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False, timeout=HANG_GUARD_S)
    assert out.stdout.split("\n")[:2] == ["raise raised True", "skip skipped 1 True"], \
        out.stdout + out.stderr
