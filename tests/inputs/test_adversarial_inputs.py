"""Inputs nobody tried: narrowed compute dtypes, layouts, option types, nasty spectra,
batch neighbours.

The regression tests name what broke; the hypothesis hunts at the end draw what the
other searches do not (``tests/accuracy/test_adversarial_search.py`` draws the methods,
families and stopping modes): exact repeats, diagonal and permuted matrices, a tiny
negative eigenvalue, n = 1, scales by 2^k across the dtype's range, on NumPy and torch,
with the options that change the verdict's path (``compute_dtype`` across the input's,
``steps="fixed"``, ``certificate="randomized"``, ``verdict="device"``, 16-bit matmuls,
``fallback``), and random neighbours that must leave a matrix's bits alone.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import matroot
from matroot.solvers.registry import accuracy_target
from matroot.testing import oracle_inv_root, relative_error
from matroot.testing.spectra import family_stack


def _quiet(call, *args, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return call(*args, **options)


@pytest.mark.parametrize("method", ["evd", "minimax", "coupled_newton"])
@pytest.mark.parametrize("options", [{}, {"rtol": 1e-2}], ids=["table", "rtol"])
def test_float64_input_computed_in_float32_counts_the_rounding_of_the_input(method, options):
    """float64 input with ``compute_dtype="float32"``: the check sees only the stack
    rounded to float32, which moves the root by up to ``‖A − fl(A)‖_F/(p·λmin)``.
    evd's float64 retry of the rounded stack came back converged 0.1–0.2 off at
    κ = 1e7 (p = 1, 2; estimates 1e-7) and 1.8e-2 off at κ = 8e5 (table: 1e-3), and
    50× an ``rtol`` of 1e-2."""
    rng = np.random.default_rng(0)
    a = np.concatenate([family_stack(family, rng, (4,), 16, kappa)
                        for family in ("kms", "tridiagonal", "flat_bulk")
                        for kappa in (1e4, 8e5, 1e7)])
    a = (a + np.swapaxes(a, -1, -2)) / 2
    lam = np.linalg.eigvalsh(a)
    kappa = lam[:, -1] / lam[:, 0]
    for p in (1, 2):
        res = _quiet(matroot.inv_root_info, a, p, method=method, compute_dtype="float32",
                     **options)
        error = relative_error(res.root, oracle_inv_root(a, p, refine=True))
        target = options.get("rtol", accuracy_target(method, "float32", p, kappa))
        converged = np.asarray(res.converged)
        assert np.all(error[converged] <= np.broadcast_to(target, error.shape)[converged]), \
            (p, error[converged].max())
        assert np.all(res.error_estimate[converged] <= 0.5), "an estimate that cannot hold"


@pytest.mark.parametrize("flag", ["no", "False", None, 0, 1.0])
@pytest.mark.parametrize("call", [matroot.inv_root_info, matroot.polar_info],
                         ids=["inv_root", "polar"])
def test_check_finite_takes_only_a_bool(call, flag):
    """``check_finite="no"`` read as True (a string's truth value) and ``None`` as
    False: a TypeError now says what it takes."""
    a = np.eye(3)[None]
    with pytest.raises(TypeError, match="check_finite must be True or False"):
        call(a, 2, check_finite=flag) if call is matroot.inv_root_info else \
            call(a, check_finite=flag)
    call(a, 2, check_finite=np.bool_(False)) if call is matroot.inv_root_info else \
        call(a, check_finite=np.bool_(False))


@pytest.mark.parametrize("method", ["newton_db", "coupled_newton", "minimax"])
def test_fixed_steps_of_a_float64_torch_inverse_computed_in_float32(method):
    """``steps="fixed"``, p = 1, float64 torch input, ``compute_dtype="float32"``: the
    range test clipped the float32 root norm to float64's largest number, which torch
    refuses (RuntimeError: value cannot be converted to type float without overflow)."""
    torch = pytest.importorskip("torch")
    a = torch.diag(torch.tensor([2.0, 4.0, 8.0], dtype=torch.float64))[None]
    res = matroot.inv_root_info(a, 1, method=method, rtol=1e-4, steps="fixed",
                                compute_dtype="float32")
    assert res.root.dtype == torch.float64 and bool(res.converged.all())
    np.testing.assert_allclose(np.diag(res.root[0].numpy()), [0.5, 0.25, 0.125], rtol=1e-4)
