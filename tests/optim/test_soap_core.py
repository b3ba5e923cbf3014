"""Stacked SOAP's functional core against a per-parameter float64 reference
(tests/soap_reference.py): updates, the moments' rotation, bias correction, one-sided
blocks, non-finite gradients."""

from __future__ import annotations

import numpy as np
import pytest

from matroot.optim.shampoo_core.config import NonFiniteGradientError
from matroot.optim.soap import SOAPConfig, init, update
from matroot.optim.soap.rotation import _rotate_group
from soap_reference import ReferenceSOAP

#: Shapes covering: two same-shape matrices (one stack), a matrix cut into blocks, a
#: 3-D tensor merged to a matrix, a vector and a scalar (AdamW), and a one-sided block
#: (its 20 columns are over max_preconditioned_dim=10). Every factor has full rank from
#: the first refresh (step 2) on: a repeated eigenvalue (a null space) has no unique
#: basis, and SOAP's direction depends on the one chosen, so no reference can match it.
SHAPES = [(4, 3), (4, 3), (8, 6), (4, 3, 2), (7,), (), (3, 20)]
OPTIONS = dict(lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
               precondition_frequency=2, start_preconditioning_step=2, block_size=4,
               max_preconditioned_dim=10)
#: Tight enough that the stacked refresh's bases are eigh's up to order and signs.
TIGHT = dict(eigenbasis_rtol=1e-12, eigenbasis_iterations=4)


def _problem(seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s) for s in shapes]
    targets = [rng.standard_normal(s) for s in shapes]
    return params, targets, rng


def _grads(params, targets, rng):
    # A gradient that drifts with the parameters and carries noise, so that the bases
    # turn between refreshes.
    return [(p - t) * (1 + 0.3 * rng.standard_normal(p.shape)) for p, t in zip(params, targets)]


def _run(steps, options, *, seed=0, missing=None):
    params, targets, rng = _problem(seed)
    config = SOAPConfig(**options, **TIGHT)
    state = init(params, config)
    ref = ReferenceSOAP(params, **options)
    ref_params = [p.copy() for p in params]
    for _ in range(steps):
        grads = _grads(params, targets, rng)
        for i in (missing or {}).get(state.step + 1, ()):
            grads[i] = None
        updates, state = update(grads, state, params, config)
        params = [p if u is None else p + u for p, u in zip(params, updates)]
        ref_params = ref.step(ref_params, grads)
        yield params, ref_params, state


@pytest.mark.parametrize("bias_correction", [True, False])
def test_updates_match_the_per_parameter_reference(bias_correction):
    options = dict(OPTIONS, bias_correction=bias_correction)
    for params, ref_params, state in _run(9, options):  # noqa: B007 (read after)
        for p, r in zip(params, ref_params):
            np.testing.assert_allclose(p, r, rtol=1e-9, atol=1e-9)
    assert state.refreshes == 4
    one_sided = [g for g in state.plan.groups if (g.left is None) != (g.right is None)]
    assert one_sided and len(one_sided) < len(state.plan.groups)


def test_parameters_without_a_gradient_keep_their_state():
    """A parameter whose blocks share a stack with others misses steps 3 and 4 (its
    run of blocks is cut out of the stack), the vector step 5: the rest go on, and each
    one's bias corrections follow its own step count."""
    missing = {3: (1,), 4: (1, 2), 5: (4,)}
    for params, ref_params, _ in _run(8, OPTIONS, missing=missing):
        for p, r in zip(params, ref_params):
            np.testing.assert_allclose(p, r, rtol=1e-9, atol=1e-9)


def test_copy_state_shares_no_memory():
    from matroot.optim.soap import copy_state, state_bytes
    params, targets, rng = _problem()
    config = SOAPConfig(**OPTIONS)
    state = init(params, config)
    _, state = update(_grads(params, targets, rng), state, params, config)
    copied = copy_state(state)
    copied.block_exp_avg[0][...] = 7.0
    assert not np.any(state.block_exp_avg[0] == 7.0)
    sizes = state_bytes(state)
    assert sizes["total"] == sizes["moments"] + sizes["factors"] > 0


def test_bias_correction_changes_early_steps():
    """The first step with bias correction is AdamW's: ±lr per entry (before decay)."""
    params, targets, rng = _problem()
    config = SOAPConfig(**dict(OPTIONS, weight_decay=0.0))
    grads = _grads(params, targets, rng)
    updates, _ = update(grads, init(params, config), params, config)
    for u, g in zip(updates, grads):
        np.testing.assert_allclose(u, -0.05 * g / (np.abs(g) + 1e-8), rtol=1e-6)
    off = SOAPConfig(**dict(OPTIONS, weight_decay=0.0, bias_correction=False))
    updates_off, _ = update(grads, init(params, off), params, off)
    np.testing.assert_allclose(updates_off[4], updates[4] * 0.1 / np.sqrt(0.05), rtol=1e-6)


def test_first_moment_is_the_gradient_ema_in_any_basis():
    """Rotated back, the eigenbasis first moment is the plain EMA of the gradients, across
    every refresh (the rotation is exact)."""
    params, targets, rng = _problem(1)
    config = SOAPConfig(**OPTIONS)          # the default, loose refresh
    state = init(params, config)
    ema = np.zeros((4, 3))
    for _ in range(7):
        grads = _grads(params, targets, rng)
        ema = 0.9 * ema + 0.1 * grads[0]
        _, state = update(grads, state, params, config)
        group = next(g for g in state.plan.groups if g.shape == (4, 3))
        k = [b.param for b in group.blocks].index(0)
        (ls, lf), (rs, rf) = group.left, group.right
        ql, qr = state.bases[ls][lf + k], state.bases[rs][rf + k]
        m = state.block_exp_avg[state.plan.groups.index(group)][k]
        np.testing.assert_allclose(ql @ m @ qr.T, ema, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ql.T @ ql, np.eye(4), atol=1e-4)


def test_second_moment_follows_a_reordered_basis():
    """A new basis that is the old one with columns swapped and signs flipped permutes
    the second moment and rotates the first exactly."""
    params, _, _ = _problem()
    config = SOAPConfig(block_size=1024)
    state = init([np.zeros((3, 2))], config)
    group = state.plan.groups[0]
    rng = np.random.default_rng(0)
    m, v = rng.standard_normal((1, 3, 2)), rng.random((1, 3, 2))
    p_left = np.array([[0, -1, 0], [1, 0, 0], [0, 0, 1.0]])[None]
    p_right = np.array([[0, 1], [-1, 0.0]])[None]
    rotations = [None, None]
    for (s, _), p in zip((group.left, group.right), (p_left, p_right)):
        rotations[s] = p
    new_m, new_v = _rotate_group(np, group, rotations, m, v)
    np.testing.assert_array_equal(new_m[0], p_left[0] @ m[0] @ p_right[0].T)
    np.testing.assert_array_equal(new_v[0], v[0][[1, 0, 2]][:, [1, 0]])


def test_one_sided_block_keeps_identity_on_the_long_side():
    params, targets, rng = _problem()
    config = SOAPConfig(**OPTIONS)
    state = init(params, config)
    for _ in range(3):
        _, state = update(_grads(params, targets, rng), state, params, config)
    layout = state.plan.params[6]
    assert layout.sides == (True, False)
    group = next(g for g in state.plan.groups if g.blocks[0].param == 6)
    assert group.right is None and group.left is not None
    assert state.plan.stacks[group.left[0]].size == 3
    # Its factor shares the size-3 stack with the two-sided (4, 3) blocks' right factors.
    assert state.plan.stacks[group.left[0]].count == 3


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_nan_gradient_follows_the_policy(policy):
    params, targets, rng = _problem()
    config = SOAPConfig(**OPTIONS, nonfinite_grads=policy)
    state = init(params, config)
    _, state = update(_grads(params, targets, rng), state, params, config)
    grads = _grads(params, targets, rng)
    grads[2] = grads[2].copy()
    grads[2][1, 1] = np.nan
    if policy == "raise":
        with pytest.raises(NonFiniteGradientError, match=r"parameters \[2\]"):
            update(grads, state, params, config)
        return
    updates, after = update(grads, state, params, config)
    assert all(not np.any(u) for u in updates)
    assert after.skipped_steps == 1 and after.step == 1
    # On the device (no host read): the same skip, the state's arrays unchanged.
    from matroot.optim.soap import all_finite
    updates, device = update(grads, state, params, config, check_grads=False,
                             finite=all_finite(grads))
    assert all(not np.any(u) for u in updates) and int(device.skipped_steps) == 1
    for name in ("block_exp_avg", "block_exp_avg_sq", "factors", "exp_avg"):
        for a, b in zip(getattr(state, name), getattr(device, name)):
            if a is not None:
                np.testing.assert_array_equal(a, b)


def test_bad_options_name_the_fix():
    with pytest.raises(TypeError, match="max_preconditioned_dim"):
        from matroot.optim.soap import soap
        soap(max_precond_dim=100)
    with pytest.raises(ValueError, match="precondition_frequency"):
        SOAPConfig(precondition_frequency=0)


def test_a_refreshed_basis_serves_from_the_next_step():
    """Regression: the basis refreshed at step 1 (from G₁'s factors) must not rotate G₁
    itself. In that basis G₁ is diagonal up to rounding, and Adam's normalisation made
    its off-diagonal rounding ±1 entries: the step-1 update was noise."""
    rng = np.random.default_rng(3)
    params = [rng.standard_normal((6, 5))]
    config = SOAPConfig(lr=0.1, weight_decay=0.0, start_preconditioning_step=1)
    grads = [rng.standard_normal((6, 5))]
    updates, state = update(grads, init(params, config), params, config)
    np.testing.assert_allclose(updates[0], -0.1 * np.sign(grads[0]), rtol=1e-6)
    assert state.refreshes == 1
    assert not np.allclose(state.bases[0][0], np.eye(state.bases[0].shape[-1]))
