"""Shampoo's per-dimension and per-parameter policies: one-sided embeddings
(``max_preconditioned_dim``, ``skip_dims``), whole-parameter blocks, graft-only
parameters, and the policies it refuses."""

import math

import pytest

torch = pytest.importorskip("torch")

import matroot  # noqa: E402
from matroot.optim import Shampoo, ShampooConfig  # noqa: E402
from shampoo_torch_runs import linear_problem, run_steps  # noqa: E402


def _one_sided_reference(grad, beta2, eps, matrix_eps):
    """Step 1 of one-sided (columns) Shampoo with Adam grafting, float64, from definitions."""
    g = grad.double()
    factor = (1 - beta2) * g.T @ g + matrix_eps * torch.eye(g.shape[1], dtype=torch.float64)
    vals, vecs = torch.linalg.eigh(factor)
    direction = g @ (vecs * vals ** -0.5) @ vecs.T
    adam = g / (g.abs() + eps)
    return direction * (adam.norm() / direction.norm())


@pytest.mark.parametrize("policy", [dict(max_preconditioned_dim=100), dict(skip_dims=(0,))])
def test_one_sided_embedding_gets_only_its_small_side_and_follows_the_definition(policy):
    gen = torch.Generator().manual_seed(3)
    emb = torch.nn.Parameter(torch.randn(300, 8, generator=gen, dtype=torch.float64))
    opt = Shampoo([emb], lr=0.1, weight_decay=0.0, block_size=64, precondition_frequency=1,
                  root_method="evd", matrix_eps=1e-6, **policy)
    grad = torch.randn(300, 8, generator=gen, dtype=torch.float64)
    emb.grad = grad.clone()
    before = emb.detach().clone()
    opt.step()
    stacks = opt._families[0].state.plan.stacks
    assert [(s.size, s.root, s.count) for s in stacks] == [(8, 2, 1)]   # rows not cut
    expected = -0.1 * _one_sided_reference(grad, 0.999, 1e-8, 1e-6)
    torch.testing.assert_close(emb.detach() - before, expected, rtol=1e-9, atol=1e-12)


def test_one_sided_embedding_state_is_within_1_2x_of_adamw():
    emb = torch.nn.Parameter(torch.zeros(50000, 64))
    opt = Shampoo([emb], max_preconditioned_dim=4096, precondition_frequency=1)
    emb.grad = torch.randn(50000, 64) * 1e-2
    opt.step()
    adamw_bytes = 2 * emb.numel() * 4
    assert opt.diagnostics()["state_bytes"] <= 1.2 * adamw_bytes


def test_infinite_block_size_preconditions_each_parameter_whole():
    x, y, w, b = linear_problem(4, rows=70, cols=9)
    opt = Shampoo([w, b], block_size=math.inf, precondition_frequency=2)
    run_steps((w, b), opt, x, y, 3)
    plan = opt._families[0].state.plan
    assert [len(g.blocks) for g in plan.groups] == [1]
    assert sorted(s.size for s in plan.stacks) == [9, 70]


def test_graft_only_parameters_follow_adamw_and_policies_share_one_call_per_size(monkeypatch):
    calls = []
    solve = matroot.optim.shampoo_core.preconditioner.inv_root_info

    def counting(a, p, **kwargs):
        calls.append((tuple(a.shape), p))
        return solve(a, p, **kwargs)

    monkeypatch.setattr(matroot.optim.shampoo_core.preconditioner, "inv_root_info", counting)
    gen = torch.Generator().manual_seed(5)
    kept = torch.nn.Parameter(torch.randn(16, 16, generator=gen))
    one_sided = torch.nn.Parameter(torch.randn(400, 16, generator=gen))
    adam_only = torch.nn.Parameter(torch.randn(16, 16, generator=gen))
    twin = adam_only.detach().clone().requires_grad_()
    opt = Shampoo([{"params": [kept, adam_only]},
                   {"params": [one_sided], "max_preconditioned_dim": 64, "lr": 5e-3}],
                  lr=1e-2, precondition_frequency=1, graft_only=lambda p: p is adam_only)
    ref = torch.optim.AdamW([twin], lr=1e-2)
    for _ in range(3):
        for p in (kept, one_sided, adam_only):
            p.grad = torch.randn(p.shape, generator=gen)
        twin.grad = adam_only.grad.clone()
        opt.step()
        ref.step()
    assert len(opt._families) == 1                  # per-parameter policies share stacks
    assert sorted(calls) == sorted([((2, 16, 16), 4), ((1, 16, 16), 2)] * 3)
    torch.testing.assert_close(adam_only, twin, rtol=1e-5, atol=1e-6)


def test_bad_policies_are_rejected():
    with pytest.raises(ValueError, match="skip_dims"):
        ShampooConfig(skip_dims=(2,))
    with pytest.raises(ValueError, match="max_preconditioned_dim"):
        ShampooConfig(max_preconditioned_dim=0)
    with pytest.raises(ValueError, match="block_size"):
        ShampooConfig(block_size=-math.inf)
