"""One bad or different matrix in a batch changes none of its neighbours' bits or flags.

Issue 36: minimax with 16-bit matmuls shared two decisions across the stack, its
16-bit step count (the longest schedule of any matrix's λmin bound) and when ``Z``'s
products stop rounding (the largest ‖Z‖ bound): a neighbour with a smaller bound (an
indefinite matrix, or only a larger κ) changed every other root's bits.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import matroot
from matroot.testing import spd_stack

from conftest import to_numpy

N = 16
FIELDS = ("root", "converged", "iterations", "error_estimate", "residual", "matmuls",
          "lambda_max")


def _goods():
    return spd_stack(np.random.default_rng(1), (3,), N, 1e3)[0].astype(np.float32)


def _neighbours():
    rng = np.random.default_rng(2)
    return {
        "kappa_1e5": spd_stack(rng, (1,), N, 1e5)[0][0].astype(np.float32),
        "kappa_1e8": spd_stack(rng, (1,), N, 1e8)[0][0].astype(np.float32),
        "indefinite": np.diag(np.r_[-1.0, np.ones(N - 1)]).astype(np.float32),
        "nan": np.full((N, N), np.nan, np.float32),
        "huge": (np.eye(N) * 1e30).astype(np.float32),
    }


def _assert_neighbours_unchanged(xp_asarray, method, p, **options):
    goods = _goods()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = matroot.inv_root_info(xp_asarray(goods), p, method=method,
                                      check_finite=False, **options)
        for name, other in _neighbours().items():
            batch = np.concatenate([goods[:2], other[None], goods[2:]])
            res = matroot.inv_root_info(xp_asarray(batch), p, method=method,
                                        check_finite=False, **options)
            for j, i in enumerate([0, 1, 3]):
                changed = [f for f in FIELDS if not np.array_equal(
                    to_numpy(getattr(res, f))[i], to_numpy(getattr(alone, f))[j],
                    equal_nan=True)]
                assert not changed, (name, j, changed)


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("options", [{}, {"tol": 0, "max_iter": 8}],
                         ids=["default", "fixed_steps"])
def test_minimax_16_bit_neighbours_numpy(p, options):
    _assert_neighbours_unchanged(np.asarray, "minimax", p, matmul_dtype="float16", **options)


@pytest.mark.parametrize("matmul_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("p", [2, 4])
def test_minimax_16_bit_neighbours_torch(matmul_dtype, p):
    torch = pytest.importorskip("torch")
    _assert_neighbours_unchanged(torch.from_numpy, "minimax", p, matmul_dtype=matmul_dtype)


@pytest.mark.parametrize("method", ["newton_db", "coupled_newton", "minimax", "chebyshev"])
@pytest.mark.parametrize("options", [{}, {"rtol": 0.5}, {"tol": 0.1}, {"tol": 0, "max_iter": 6}],
                         ids=["default", "rtol", "tol", "fixed_steps"])
def test_full_precision_neighbours(method, options):
    _assert_neighbours_unchanged(np.asarray, method, 2, **options)
