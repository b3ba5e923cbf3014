"""The elementwise kernels of a Shampoo step: block norms, the gradient screen and the
moments' in-place update, against plain references on NumPy and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from matroot.optim import ShampooConfig
from matroot.optim.shampoo_core.gradients import nonfinite_flags
from matroot.optim.shampoo_core.grafting import block_norms, grafting_direction

FLOAT32_EPS = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize("as_array", [np.asarray, torch.as_tensor], ids=["numpy", "torch"])
@pytest.mark.parametrize("magnitude", [1e-42, 1e-30, 1.0, 1e30, 3e38])
def test_block_norms_hold_at_every_magnitude(as_array, magnitude):
    """float32 blocks from subnormal to near the largest float32: the norm of the float64
    copy, rounded to float32, to a few roundings (one per scaling, the sum's error
    grows with the 48 terms as √n·eps at worst), where squaring in float32 would
    overflow or vanish."""
    rng = np.random.default_rng(3)
    blocks = (rng.uniform(0.1, 1.0, (3, 4, 12)) * magnitude / 12).astype(np.float32)
    expected = np.linalg.norm(blocks.astype(np.float64).reshape(3, -1), axis=1)
    got = np.asarray(block_norms(as_array(blocks)), dtype=np.float64)
    tiny = float(np.finfo(np.float32).smallest_subnormal)
    # Subnormal entries carry fewer digits: an absolute term of a few subnormal steps.
    np.testing.assert_allclose(got, expected, rtol=16 * FLOAT32_EPS, atol=4 * tiny * 12)


@pytest.mark.parametrize("as_array", [np.asarray, torch.as_tensor], ids=["numpy", "torch"])
def test_block_norms_of_zero_and_nonfinite_blocks(as_array):
    blocks = np.zeros((3, 2, 2), dtype=np.float32)
    blocks[1, 0, 0], blocks[2, 1, 1] = np.nan, np.inf
    got = np.asarray(block_norms(as_array(blocks)))
    assert got[0] == 0 and np.isnan(got[1]) and not np.isfinite(got[2])


def test_the_gradient_screen_flags_exactly_the_nonfinite_gradients():
    """Finite gradients whose float32 sum would overflow are finite; NaN and Inf are
    found in every dtype, with no overflow warning from the screen."""
    huge = np.full(4, 3e38, dtype=np.float32)
    with np.errstate(all="raise"):
        flags = nonfinite_flags([huge, None, np.array([1.0, np.inf]), np.array([np.nan])])
    assert flags == [False, False, True, True]
    assert nonfinite_flags([torch.full((3,), 3e38),
                            torch.tensor([1.0, float("nan")], dtype=torch.bfloat16),
                            torch.tensor([-float("inf")], dtype=torch.float16)]) == \
        [False, True, True]


@pytest.mark.parametrize("grafting", ["adam", "adagrad", "sgd"])
@pytest.mark.parametrize("as_array", [np.asarray, torch.as_tensor], ids=["numpy", "torch"])
def test_moments_overwritten_in_place_equal_the_functional_update(as_array, grafting):
    """The in-place update writes into the given moments and computes what the
    functional one returns (the same elementwise operations in the same order: equal
    to a rounding or two)."""
    rng = np.random.default_rng(4)
    config = ShampooConfig(grafting=grafting)
    grad, m, v = (as_array(rng.standard_normal((5, 3)).astype(np.float32)) for _ in range(3))
    v = None if grafting == "sgd" else v * v
    xp = np if as_array is np.asarray else torch
    copies = [None if a is None else (a.copy() if xp is np else a.clone()) for a in (m, v)]
    functional = grafting_direction(xp, grad, *copies, 3, config, in_place=False)
    in_place = grafting_direction(xp, grad, m, v, 3, config, in_place=True)
    assert in_place[0] is m and (v is None or in_place[1] is v)
    for a, b in zip(in_place, functional):
        if a is None:
            assert b is None
            continue
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=4 * FLOAT32_EPS,
                                   atol=0)
