"""Operations and host syncs of a Shampoo step, counted through torch's dispatcher on the
CPU (issue 35's definition, matroot/testing/launch_count.py): deterministic, so the
budgets are asserted, not timed.

The model is issue 35's (16 × Linear(256, 256), 4 × Linear(512, 256), odd shapes and a
conv; block_size 256, coupled Newton, a refresh every third step): the step between
refreshes within twice AdamW(foreach)'s operations, 16 more same-shape layers adding
at most 10, no host sync with ``nonfinite_grads="skip"`` and one with "raise"; the
refresh step within half of Distributed Shampoo's, its work outside the solver calls
bounded per stack, reading the host no more than between refreshes.
"""

from __future__ import annotations

import pytest
import torch

import matroot.optim.shampoo_core.preconditioner as preconditioner
from bench.optim_launches import count_steps, launch_model, shampoo_options
from matroot.optim import Shampoo
from matroot.testing.launch_count import LaunchCount

#: Step 3 refreshes the roots; step 4 is a step between refreshes with its state made.
REFRESH, BETWEEN = 2, 3


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, foreach=True)


def _shampoo(policy):
    return lambda params: Shampoo(params, **shampoo_options(nonfinite_grads=policy))


@pytest.fixture(scope="module")
def counts():
    out = {"adamw": count_steps(_adamw, launch_model(), 2)[-1]}
    for policy in ("raise", "skip"):
        for extra in (0, 16):
            out[policy, extra] = count_steps(_shampoo(policy), launch_model(extra), 4)
    return out


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_the_step_between_refreshes_costs_what_the_block_sizes_do(counts, policy):
    ops, syncs = counts[policy, 0][BETWEEN]
    adamw_ops = counts["adamw"][0]
    # "skip" screens the gradients on the device (one select zeroes them, one makes all
    # coefficients of a dtype, the counters add the flag): within the same budget as
    # "raise", which reads the screen's verdict on the host once.
    assert ops <= 2.0 * adamw_ops, f"{ops} operations against AdamW's {adamw_ops}"
    assert syncs == (1 if policy == "raise" else 0)
    more_ops, more_syncs = counts[policy, 16][BETWEEN]
    assert more_ops - ops <= 10 and more_syncs == syncs


def test_adamw_is_the_yardstick_the_issue_measured(counts):
    """The count itself, so a changed counter or model shows here, not as a moved budget."""
    assert counts["adamw"][0] == 103


#: Meta's Distributed Shampoo at a refresh step on this model (issue 35's table, its
#: default eigh): the refresh step's budget is half of it.
DISTRIBUTED_SHAMPOO_REFRESH_OPS = 3280


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_the_refresh_step_within_half_of_distributed_shampoo(counts, policy):
    """With the defaults (fixed-step solves certified to rtol, verdicts on the device)
    the refresh step is within issue 35's 0.5× Distributed Shampoo, reads the host no
    more than a step between refreshes (none with "skip"), and 16 more same-shape
    layers add nothing (they join the 256 stack: the same solves)."""
    ops, syncs = counts[policy, 0][REFRESH]
    assert ops <= 0.5 * DISTRIBUTED_SHAMPOO_REFRESH_OPS, ops
    assert syncs == counts[policy, 0][BETWEEN][1] == (1 if policy == "raise" else 0)
    more_ops, more_syncs = counts[policy, 16][REFRESH]
    assert more_ops - ops <= 10 and more_syncs == syncs


def test_a_refresh_adds_only_the_solves_and_their_bookkeeping():
    """At a refresh, the operations outside the inv_root_info calls (factor update,
    preconditioning, the refresh's selects) stay within a fixed number per stack, every
    solve is a fixed-step one with its verdict on the device, and nothing reads the
    host (issue 35's device-verdict mode)."""
    inside, calls = [], []
    solve = preconditioner.inv_root_info

    def counted(*args, **kwargs):
        with LaunchCount() as c:
            result = solve(*args, **kwargs)
        inside.append((c.ops, c.syncs))
        calls.append(kwargs)
        return result

    model = launch_model()
    original = preconditioner.inv_root_info
    preconditioner.inv_root_info = counted
    try:
        opt_counts = count_steps(_shampoo("skip"), model, 4)
    finally:
        preconditioner.inv_root_info = original
    stacks = 6      # sizes 10, 16, 27, 37, 100, 256
    assert len(inside) == stacks
    assert all(k["steps"] == "fixed" and k["verdict"] == "device" and k["rtol"] == 1e-2
               for k in calls), calls
    ops, syncs = opt_counts[REFRESH]
    solver_ops, solver_syncs = (sum(c[k] for c in inside) for k in (0, 1))
    between_ops, between_syncs = opt_counts[BETWEEN]
    # Per stack: unpacking the factors, the failure counts and the select of the kept
    # roots (6 on this model; the carried bounds are not touched by a fixed-step solve).
    assert ops - solver_ops - between_ops <= 8 * stacks, (ops, solver_ops, between_ops)
    assert syncs == solver_syncs == between_syncs == 0
