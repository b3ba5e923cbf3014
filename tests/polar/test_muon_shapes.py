"""Muon's split option (issue 37): a fused QKV weight orthogonalized as 3 matrices or
one per head, a convolution by output-channel groups, in the torch and optax shells."""

from __future__ import annotations

import numpy as np
import pytest

import matroot
from matroot.optim.muon.core import matrix_stack_shape

torch = pytest.importorskip("torch")


def _block_factors(grad: np.ndarray, blocks: int) -> np.ndarray:
    """polar of each row block of grad, from the SVD (float64)."""
    pieces = grad.reshape(blocks, grad.shape[0] // blocks, -1)
    return matroot.polar(pieces, method="svd").reshape(grad.shape)


@pytest.mark.parametrize("blocks", [3, 12])
def test_torch_split_orthogonalizes_each_block_of_rows(blocks):
    """A fused QKV weight (96, 32) with split=3 gets three (32, 32) factors (shape
    scale 1 each, not the fused matrix's √3); split=12 one (8, 32) factor per head."""
    from matroot.optim import Muon
    weight = torch.nn.Parameter(torch.zeros(96, 32, dtype=torch.float64))
    opt = Muon([{"params": [weight], "use_muon": True, "split": blocks}], lr=1.0,
               polar_method="svd")
    grad = torch.randn(96, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    weight.grad = grad
    opt.step()
    expected = _block_factors(grad.numpy(), blocks)
    np.testing.assert_allclose(-weight.detach().numpy(), expected, atol=1e-10)
    whole = matroot.polar(grad.numpy(), method="svd")
    assert not np.allclose(expected, whole, atol=1e-3)


def test_conv_kernels_are_out_by_in_k_k_and_split_by_channel_groups():
    assert matrix_stack_shape((64, 16, 3, 3)) == (1, 64, 144)
    assert matrix_stack_shape((64, 16, 3, 3), split=4) == (4, 16, 144)
    assert matrix_stack_shape((4, 96, 32), split=3) == (12, 32, 32)
    with pytest.raises(ValueError, match="divisor of 96"):
        matrix_stack_shape((96, 32), split=5)


def test_a_split_that_does_not_divide_is_refused_when_the_optimizer_is_made():
    from matroot.optim import Muon
    weight = torch.nn.Parameter(torch.zeros(96, 32))
    with pytest.raises(ValueError, match="split=5"):
        Muon([{"params": [weight], "use_muon": True, "split": 5}])


def test_optax_split_by_path():
    pytest.importorskip("optax")
    import jax
    import jax.numpy as jnp

    from matroot.optim.optax import scale_by_muon
    with jax.enable_x64(True):
        grad = np.random.default_rng(1).standard_normal((96, 32))
        params = {"qkv": jnp.zeros((96, 32)), "out": jnp.zeros((32, 32))}
        opt = scale_by_muon(polar_method="svd",
                            split=lambda path, leaf: 3 if path == "qkv" else 1)
        state = opt.init(params)
        grads = {"qkv": jnp.asarray(grad), "out": jnp.asarray(grad[:32])}
        updates, _ = opt.update(grads, state, params)
        np.testing.assert_allclose(np.asarray(updates["qkv"]), _block_factors(grad, 3),
                                   atol=1e-10)


def test_auto_iterates_tall_matrices_on_the_gram_side_with_the_same_steps(monkeypatch):
    """The default ``polar_method="auto"`` takes the Gram side from aspect ratio 4
    (no restart in Muon's 4 steps), the matrix itself below: in float64 both give
    Polar Express's direction to rounding."""
    import matroot.optim.muon.core as core
    from matroot.solvers.polar.coefficients import MUON_LOWER
    methods = []

    def recording(stack, **options):
        methods.append((stack.shape[-2:], options["method"]))
        return matroot.polar_info(stack, **options)

    monkeypatch.setattr(core, "polar_info", recording)
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal((64, 8)) @ np.diag(np.logspace(0, -2, 8)),
             rng.standard_normal((16, 8))]
    state = core.muon_init(grads, [True, True])
    directions, _ = core.muon_directions(grads, state, [True, True], core.MuonConfig())
    assert sorted(methods) == [((16, 8), "polar_express"), ((64, 8), "gram_newton_schulz")]
    for g, d in zip(grads, directions):
        expected = matroot.polar_info(g, method="polar_express", lower=MUON_LOWER,
                                      max_iter=4).root
        scale = max(1.0, g.shape[0] / g.shape[1]) ** 0.5
        np.testing.assert_allclose(d, scale * expected, atol=1e-10)
