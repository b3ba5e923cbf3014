"""The optax Muon on JAX frameworks' parameter layouts.

The Muon core reads a parameter in torch's layouts: ``(out, in)``, ``(experts, out,
in)``, ``(out, in, kh, kw)``. flax and haiku store a convolution ``(kh, kw, in, out)``,
which the core read as the matrix ``(kh, kw·in·out)`` of rank ≤ kh: a flax-layout 3×3
convolution fitting a target for 60 steps reached loss 0.97 where the same layer in
torch's layout reached 0.14, with no word said. Their dense kernels are ``(in, out)``,
so the shape scale ``√max(1, out/in)`` of torch's and optax.contrib's Muon was read the
other way round. ``weight_dimension_numbers`` (optax.contrib.muon's) says which axes are
the matrix's; leaves of three or more dimensions without it draw a warning.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")
from matroot.optim.optax import muon  # noqa: E402

Dims = pytest.importorskip("optax.contrib").MuonDimensionNumbers

#: Plain Muon steps: the update is the shape-scaled polar factor of the gradient.
PLAIN = dict(momentum=0.0, nesterov=False)


def _grad(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _update(opt, name, g):
    params = {name: {"kernel": jnp.zeros_like(g)}}
    updates, state = opt.update({name: {"kernel": g}}, opt.init(params), params)
    return updates[name]["kernel"], state


def test_a_flax_convolution_with_dimension_numbers_steps_as_in_torchs_layout():
    hwio = _grad((3, 3, 4, 8))
    oihw = jnp.transpose(hwio, (3, 2, 0, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dimension numbers given: no layout warning
        flax_step, state = _update(muon(1.0, weight_dimension_numbers=Dims((0, 1, 2), 3),
                                        **PLAIN), "Conv_0", hwio)
    with pytest.warns(UserWarning, match="torch's layouts"):
        torch_step, _ = _update(muon(1.0, **PLAIN), "Conv_0", oihw)
    np.testing.assert_allclose(np.asarray(flax_step),
                               np.asarray(jnp.transpose(torch_step, (2, 3, 1, 0))),
                               rtol=1e-5, atol=1e-6)
    # The state stays in the leaf's own shape (checkpoints, optax.masked).
    assert state[0].momentum[0].shape == hwio.shape


def test_a_flax_dense_kernel_takes_torchs_and_optax_contribs_shape_scale():
    """``(in, out) = (16, 64)``: the scale is √(out/in) = 2, as for torch's (64, 16)."""
    g = _grad((16, 64), seed=1)
    per_tree = {"Dense_0": {"kernel": Dims(0, 1)}}
    flax_step, _ = _update(muon(1.0, weight_dimension_numbers=per_tree, **PLAIN), "Dense_0", g)
    torch_step, _ = _update(muon(1.0, **PLAIN), "Dense_0", g.T)
    np.testing.assert_allclose(np.asarray(flax_step), np.asarray(torch_step.T),
                               rtol=1e-5, atol=1e-6)
    # Its singular values are the scale 2 times the polar factor's (1 within Muon's
    # approximation, 0.8-1.2); read as (out, in) = (16, 64) the scale would be 1.
    sigma = np.linalg.svd(np.asarray(flax_step), compute_uv=False)
    assert np.all((sigma > 1.5) & (sigma < 2.5)), sigma


def test_leaves_read_in_torchs_layouts_draw_a_warning_that_names_the_fix():
    params = {"Conv_0": {"kernel": jnp.zeros((3, 3, 4, 8))},
              "Dense_0": {"kernel": jnp.zeros((8, 5))}}
    with pytest.warns(UserWarning, match=r"\(3, 3, 4, 8\) as 1 of \(3, 96\).*"
                                         r"weight_dimension_numbers"):
        muon(1e-2).init(params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        muon(1e-2, weight_dimension_numbers=lambda p: jax.tree.map(
            lambda leaf: Dims((0, 1, 2), 3) if leaf.ndim == 4 else None, p)).init(params)
        muon(1e-2, use_muon=lambda name, leaf: leaf.ndim == 2).init(params)


def test_overlapping_dimension_numbers_name_the_leaf():
    with pytest.raises(ValueError, match=r"Conv_0\.kernel.*disjoint"):
        muon(1e-2, weight_dimension_numbers=Dims(0, (0, 3))).init(
            {"Conv_0": {"kernel": jnp.zeros((3, 3, 4, 8))}})
