"""One rule for a step skipped for non-finite gradients (issue 36), and torch's rule for
a tensor that has a ``.grad`` but ``requires_grad=False``.

The rule: a skipped step counts in the root schedule of every family with a gradient
(the schedule is fixed on the host before the device knows the step is skipped) and
in ``skipped_steps``, and changes nothing else (moments, factors, bias-correction
steps, parameters). It is the same whoever finds the NaN (the device with
``nonfinite_grads="skip"`` everywhere, the host when some group says "raise" or the
blocks are sharded) and whatever other groups' policies are;
tests/distributed/test_distributed.py checks the sharded run against it.
"""

from __future__ import annotations

import pytest
import torch

from matroot.optim import Shampoo

SHAPES = [(12, 8), (8,), (6, 10)]
OPTIONS = dict(lr=1e-2, block_size=8, precondition_frequency=3, root_method="evd",
               distributed=None)
STEPS, NAN_AT = 8, 2        # 1-based step 2 of 8 has a NaN


def _params(shapes=SHAPES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def _grads(params, step, nan=False):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    if nan:
        params[0].grad[0, 0] = float("nan")


def _run(groups, watched, extra=()):
    """Steps 1..STEPS with a NaN in ``watched[0]`` at NAN_AT; the steps whose root
    refresh ran (per step, the first family's refresh count)."""
    opt = Shampoo(groups, **OPTIONS)
    refreshed = []
    for step in range(1, STEPS + 1):
        _grads(watched, step, nan=step == NAN_AT)
        _grads(list(extra), 50 + step)
        before = int(opt._families[0].state.root_refreshes) if opt._families else 0
        opt.step()
        if int(opt._families[0].state.root_refreshes) > before:
            refreshed.append(step)
    return opt, refreshed


def test_a_skipped_step_counts_in_the_schedule_and_changes_nothing_else():
    params = _params()
    opt, refreshed = _run([{"params": params, "nonfinite_grads": "skip"}], params)
    assert refreshed == [3, 6]
    assert opt.diagnostics()["skipped_steps"] == 1
    # Bias corrections count the steps taken: 7 of 8.
    assert all(float(opt.state[p]["step"]) == STEPS - 1 for p in params)


@pytest.mark.parametrize("found_by", ["device", "host"])
def test_the_rule_does_not_depend_on_other_groups_policies(found_by):
    """A "skip" group ends bit for bit where it ends alone, with its refreshes at the same
    steps, when another group says "raise" (which moves the check to the host) or
    "skip"."""
    alone = _params()
    _, refreshed_alone = _run([{"params": alone, "nonfinite_grads": "skip"}], alone)
    mixed, extra = _params(), _params([(5, 7)], seed=9)
    policy = "raise" if found_by == "host" else "skip"
    opt, refreshed = _run([{"params": mixed, "nonfinite_grads": "skip"},
                           {"params": extra, "nonfinite_grads": policy}], mixed, extra)
    assert refreshed == refreshed_alone == [3, 6]
    for a, b in zip(alone, mixed):
        assert torch.equal(a, b)
    # The step is skipped as a whole: counted once per family (two when the policies
    # differ, which keeps the groups' stacks apart).
    assert opt.diagnostics()["skipped_steps"] == len(opt._families) == (
        2 if found_by == "host" else 1)


def test_a_nan_in_a_raise_group_still_raises_beside_skip_groups():
    skip, strict = _params(), _params([(5, 7)], seed=9)
    opt = Shampoo([{"params": skip, "nonfinite_grads": "skip"},
                   {"params": strict, "nonfinite_grads": "raise"}], **OPTIONS)
    _grads(skip, 1)
    _grads(strict, 1, nan=True)
    with pytest.raises(ValueError, match="NaN or Inf"):
        opt.step()


def test_the_functional_core_and_the_torch_shell_raise_the_same_error():
    """One message and one policy rule (shampoo_core.gradients.apply_nonfinite_policy):
    the shell numbers parameters as state_dict does, the core as its list."""
    from matroot.optim import ShampooConfig, init, update
    from matroot.optim.shampoo_core.config import NonFiniteGradientError

    params = _params()
    _grads(params, 1, nan=True)
    grads = [p.grad for p in params]
    config = ShampooConfig(block_size=8)
    with pytest.raises(NonFiniteGradientError) as core_error:
        update(grads, init([p.detach() for p in params], config), params, config)
    with pytest.raises(NonFiniteGradientError) as shell_error:
        Shampoo(params, **OPTIONS).step()
    assert str(core_error.value) == str(shell_error.value).replace(
        " (state_dict numbering)", "") == (
        "gradients of parameters [0] contain NaN or Inf; pass nonfinite_grads='skip' "
        "to skip such steps instead")


def test_a_tensor_with_a_grad_but_no_requires_grad_moves_as_adamw_moves_it():
    """torch.optim.AdamW updates every parameter with a ``.grad``; so does Shampoo (its
    update before preconditioning starts is AdamW's), and it keeps the state."""
    gen = torch.Generator().manual_seed(4)
    start = torch.randn(6, 4, generator=gen)
    frozen = torch.nn.Parameter(start.clone(), requires_grad=False)
    twin = torch.nn.Parameter(start.clone(), requires_grad=False)
    opt = Shampoo([frozen], lr=1e-2, weight_decay=1e-2, start_preconditioning_step=100,
                  distributed=None)
    ref = torch.optim.AdamW([twin], lr=1e-2, weight_decay=1e-2)
    for _ in range(3):
        grad = torch.randn(6, 4, generator=gen)
        frozen.grad, twin.grad = grad.clone(), grad.clone()
        opt.step()
        ref.step()
    assert not torch.equal(frozen, start)
    torch.testing.assert_close(frozen, twin, rtol=1e-5, atol=1e-6)
    assert float(opt.state[frozen]["step"]) == 3
    # Without a .grad it stays as it is, as AdamW leaves it.
    frozen.grad = twin.grad = None
    kept = frozen.detach().clone()
    opt.step()
    assert torch.equal(frozen, kept)
