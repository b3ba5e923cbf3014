"""The minimax method's matmul count: the count it reports is the products it forms,
whether it stops by its residual or runs fixed steps, alone or in a batch."""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot import _xp
from matroot.solvers import SOLVERS
from matroot.testing import spd_stack


def _problem(kappa, n, *, with_eps, seed, batch=3):
    """SPD stack with κ(A + eps·I) = kappa; with_eps: rank-deficient A plus a ridge."""
    rng = np.random.default_rng(seed)
    a, _, _ = spd_stack(rng, (batch,), n, kappa, lam_max=2.5)
    if not with_eps:
        return a, 0.0
    lam, q = np.linalg.eigh(a)
    lam[..., : max(1, n // 4)] = 0.0
    return (q * lam[..., None, :]) @ np.swapaxes(q, -1, -2), 2.5 / (kappa - 1)


def _count_single(a, p, **kwargs):
    """(reported matmuls, products formed, output) of the solver on one matrix."""
    mm = _xp.Matmul(np, kwargs.pop("operand_dtype", None))
    lower = np.array([kwargs.pop("lower")])
    out = SOLVERS["minimax"].solve(a[None], p, lower=lower, check_every=1, matmul=mm, **kwargs)
    return int(out.matmuls[0]), mm.count, out


def _count_problem(p):
    a, _ = _problem(1e3, 20, with_eps=False, seed=p, batch=1)
    return (a[0] / 2.6).astype(np.float32), 1e-3 / 1.04


@pytest.mark.parametrize("operand", [None, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("max_iter", [1, 2, 5, 9])
@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_fixed_step_counts_are_the_products_formed(p, max_iter, operand):
    """With tol = 0 nothing is computed speculatively: the reported count equals
    Matmul.count (2 for the first step, 4 per later one, the final ZY, p = 1's Z²)."""
    x, lower = _count_problem(p)
    reported, formed, out = _count_single(x, p, lower=lower, tol=0.0, max_iter=max_iter,
                                          operand_dtype=operand)
    assert reported == formed
    assert int(out.iterations[0]) == max_iter * max(1, int(np.log2(p)))


@pytest.mark.parametrize("operand", [None, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("tol", [1e-3, 1e-5, 1e-12])
@pytest.mark.parametrize("p", [1, 2])
def test_stopped_counts_equal_fixed_step_counts(p, tol, operand):
    """A run stopped by its residual reports what a fixed run of the same steps
    forms (the step the loop computes speculatively before freezing a converged
    matrix is not needed by the method and is not counted)."""
    x, lower = _count_problem(p)
    reported, _, out = _count_single(x, p, lower=lower, tol=tol, max_iter=30,
                                     operand_dtype=operand)
    fixed, formed, _ = _count_single(x, p, lower=lower, tol=0.0,
                                     max_iter=int(out.iterations[0]), operand_dtype=operand)
    assert reported == fixed == formed


def test_batched_counts_match_single_runs():
    """Per-matrix counts of a batch equal those of each matrix run alone."""
    rng = np.random.default_rng(12)
    mats = [spd_stack(rng, (1,), 16, k)[0][0] / 1.05 for k in (3.0, 1e2, 1e5)]
    lowers = np.array([1 / (3.0 * 1.05), 1e-2 / 1.05, 1e-5 / 1.05])
    batch = SOLVERS["minimax"].solve(np.stack(mats), 4, lower=lowers, tol=1e-6, max_iter=30,
                               check_every=1, matmul=_xp.Matmul(np))
    singles = [_count_single(m, 4, lower=lo, tol=1e-6, max_iter=30)[0]
               for m, lo in zip(mats, lowers)]
    assert batch.matmuls.tolist() == singles
    assert len(set(singles)) == 3


def test_inv_root_info_reports_solver_count():
    a, _ = _problem(1e4, 24, with_eps=True, seed=13, batch=2)
    res = matroot.inv_root_info(a.astype(np.float32), 2, method="minimax", eps=2.5e-4)
    # 2 for the first step, 4 per later step, 1 for the ZY that confirmed the last.
    assert res.matmuls.tolist() == (4 * res.iterations - 1).tolist()
