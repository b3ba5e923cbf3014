"""Carried λmax bounds of the Shampoo factors (matroot/optim/shampoo_core/factor_bounds.py).

The bound a refresh passes as ``lambda_max_upper`` must never be below λmax of the
factor plus ridge (checked against a float64 eigvalsh oracle), the updates made with
carried bounds must match those made with bounds found afresh to the accuracy the
roots promise, and a bound that is wrong is caught by the root check, never used.
"""

import numpy as np
import pytest

import matroot.optim.shampoo_core.factor_bounds as factor_bounds
import matroot.optim.shampoo_core.preconditioner as preconditioner
from matroot.optim import ShampooConfig, apply_updates, init, update
from matroot.optim.shampoo_core.preconditioner import unpack

SHAPES = [(24, 40), (9,)]


def _gradients(seed, steps, dtype, shapes=SHAPES):
    """Low-rank-plus-noise matrix gradients whose scale jumps by up to 1e±2 between
    steps (so bounds both grow and go stale), and Gaussian vectors."""
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((shapes[0][0], 2))
    out = []
    for _ in range(steps):
        signal = basis @ rng.standard_normal((2, shapes[0][1]))
        noise = 0.05 * rng.standard_normal(shapes[0])
        out.append([((signal + noise) * 10.0 ** rng.uniform(-2, 2)).astype(dtype),
                    rng.standard_normal(shapes[1]).astype(dtype)])
    return out


class _SolveSpy:
    """Counts the refreshes that passed a carried bound and those that found their own."""

    def __init__(self, monkeypatch):
        self.carried = self.fresh = 0
        self.solve = preconditioner.inv_root_info
        monkeypatch.setattr(preconditioner, "inv_root_info", self)

    def __call__(self, *args, lambda_max_upper=None, **kwargs):
        if lambda_max_upper is None:
            self.fresh += 1
        else:
            self.carried += 1
        return self.solve(*args, lambda_max_upper=lambda_max_upper, **kwargs)


#: The carried bounds feed the adaptive loop (a fixed-step solve takes none): these
#: tests ask for it, and for roots certified to a float64 target.
ADAPTIVE = {"steps": "adaptive", "rtol": 1e-6}


def _update_tolerance(state, eps):
    """Two roots per block, each within the target ``rtol`` the roots are certified to,
    in each of two runs: updates agree to 4 targets (relative)."""
    return 4 * ADAPTIVE["rtol"]


def _factor_matrices(state):
    for factors, bounds, spec in zip(state.factors, state.factor_bounds, state.plan.stacks):
        matrices = unpack(factors, spec.size) if factors.ndim == 2 else factors
        yield np.asarray(matrices, dtype=np.float64), np.asarray(bounds)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("beta2", [0.999, 1.0])
def test_carried_bound_is_never_below_lambda_max(dtype, packed, beta2, monkeypatch):
    spy = _SolveSpy(monkeypatch)
    config = ShampooConfig(lr=1e-2, betas=(0.9, beta2), block_size=16, precondition_1d=True,
                           precondition_frequency=1, root_method="newton_db",
                           symmetric_packing=packed, root_options={"steps": "adaptive"})
    grads = _gradients(0, 30, dtype)
    params = [np.zeros(s, dtype=dtype) for s in SHAPES]
    state = init(params, config)
    for step in grads:
        updates, state = update(step, state, params, config)
        params = apply_updates(params, updates)
        for matrices, bounds in _factor_matrices(state):
            top = np.linalg.eigvalsh(matrices)[:, -1]
            assert np.all(top <= bounds[:, factor_bounds.UPPER])
            assert np.all(bounds[:, factor_bounds.FLOOR] <= bounds[:, factor_bounds.UPPER])
    assert spy.carried > 0 and spy.fresh > 0


def test_updates_with_carried_bounds_match_bounds_found_afresh(monkeypatch):
    """Moments and factors are the same in both runs (no weight decay): only the roots'
    scaling differs, so the updates differ by the roots' errors only."""
    spy = _SolveSpy(monkeypatch)
    config = ShampooConfig(lr=1e-2, block_size=16, precondition_1d=True, weight_decay=0.0,
                           precondition_frequency=1, root_method="newton_db",
                           matrix_eps=1e-3, root_options=ADAPTIVE)
    grads = _gradients(1, 12, np.float64)
    params = [np.zeros(s) for s in SHAPES]
    states = {"carried": init(params, config), "fresh": init(params, config)}
    for step in grads:
        updates = {}
        for name in states:
            # A slack of 0 admits no carried bound: every refresh finds its own.
            monkeypatch.setattr(factor_bounds, "CARRY_SLACK", 1.1 if name == "carried" else 0.0)
            updates[name], states[name] = update(step, states[name], params, config)
        tolerance = _update_tolerance(states["fresh"], config.matrix_eps)
        for carried, fresh in zip(updates["carried"], updates["fresh"]):
            assert np.linalg.norm(carried - fresh) <= tolerance * np.linalg.norm(fresh)
    assert spy.carried > 0


def test_a_wrong_carried_bound_is_caught_and_replaced(monkeypatch):
    """A carried bound far below λmax scales the spectrum out of Newton–Schulz's basin:
    the check rejects those roots (the previous ones stay), the bound becomes unknown and
    the next refresh finds a right one."""
    spy = _SolveSpy(monkeypatch)
    config = ShampooConfig(lr=1e-2, block_size=16, precondition_frequency=1,
                           root_method="newton_db", weight_decay=0.0, keep_roots=True,
                           symmetric_packing=False, root_options=ADAPTIVE)
    grads = _gradients(2, 4, np.float64)
    params = [np.zeros(s) for s in SHAPES]
    state = init(params, config)
    for step in grads[:3]:
        _, state = update(step, state, params, config)
    roots_before = [np.array(r) for r in state.roots]
    failures_before = [np.array(f) for f in state.root_failures]
    wrong = []
    for matrices, _ in _factor_matrices(state):
        top = np.linalg.eigvalsh(matrices)[:, -1]
        # An infinite floor makes any finite bound count as tight.
        wrong.append(np.stack([0.01 * top, np.full_like(top, np.inf)], axis=-1))
    state = state._replace(factor_bounds=wrong)
    carried_before = spy.carried
    _, state = update(grads[3], state, params, config)
    assert spy.carried > carried_before
    rejections = 0
    for roots, old, failures, old_failures, bounds, (matrices, _), spec in zip(
            state.roots, roots_before, state.root_failures, failures_before,
            state.factor_bounds, _factor_matrices(state), state.plan.stacks):
        for j in range(spec.count):
            if failures[j] > old_failures[j]:   # rejected: the previous root stays
                rejections += 1
                np.testing.assert_array_equal(roots[j], old[j])
                assert np.isinf(bounds[j, factor_bounds.UPPER])
                continue
            # Accepted (this step's gradient lifted the bound above λmax, or the
            # spectrum stayed in the basin): then the root is right.
            lam, q = np.linalg.eigh(matrices[j] + config.matrix_eps * np.eye(spec.size))
            oracle = (q * lam ** (-1.0 / spec.root)) @ q.T
            assert np.linalg.norm(roots[j] - oracle) <= ADAPTIVE["rtol"] * np.linalg.norm(oracle)
    assert rejections > 0
    fresh_before = spy.fresh
    _, state = update(grads[0], state, params, config)
    assert spy.fresh > fresh_before
    for (matrices, bounds) in _factor_matrices(state):
        assert np.all(np.linalg.eigvalsh(matrices)[:, -1] <= bounds[:, factor_bounds.UPPER])


def test_a_state_without_bounds_finds_them_at_the_next_refresh(monkeypatch):
    spy = _SolveSpy(monkeypatch)
    config = ShampooConfig(lr=1e-2, block_size=16, precondition_frequency=2,
                           root_method="newton_db")
    grads = _gradients(3, 4, np.float64)
    params = [np.zeros(s) for s in SHAPES]
    state = init(params, config)
    _, state = update(grads[0], state, params, config)
    state = state._replace(factor_bounds=None)      # as saved before bounds were carried
    for step in grads[1:]:
        _, state = update(step, state, params, config)
    assert spy.carried == 0 or spy.fresh > 0
    for (matrices, bounds) in _factor_matrices(state):
        assert np.all(np.linalg.eigvalsh(matrices)[:, -1] <= bounds[:, factor_bounds.UPPER])


def test_zero_factors_have_the_exact_bound_zero():
    config = ShampooConfig(block_size=16)
    state = init([np.zeros((24, 40))], config)
    assert all(np.all(np.asarray(b) == 0) for b in state.factor_bounds)


def test_torch_state_dict_carries_the_bounds_and_resumes_bit_identically():
    torch = pytest.importorskip("torch")
    from matroot.optim import Shampoo

    kwargs = dict(lr=1e-2, block_size=16, precondition_frequency=1, root_method="newton_db",
                  precondition_1d=True, distributed=None)
    grads = [[torch.asarray(g) for g in step] for step in _gradients(4, 8, np.float32)]

    def run(opt, params, steps):
        for step in steps:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()

    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    opt = Shampoo(params, **kwargs)
    run(opt, params, grads[:4])
    saved = opt.state_dict()
    assert all(b is not None and b.shape[-1] == 2
               for b in saved["shampoo_families"][0]["factor_bounds"])
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed_opt = Shampoo(resumed, **kwargs)
    resumed_opt.load_state_dict(saved)
    run(opt, params, grads[4:])
    run(resumed_opt, resumed, grads[4:])
    # Same program on the same inputs: bitwise (the carried bounds came back exactly).
    for p, q in zip(params, resumed):
        assert torch.equal(p, q)

    old_format = opt.state_dict()
    del old_format["shampoo_families"][0]["factor_bounds"]
    older = Shampoo([torch.nn.Parameter(p.detach().clone()) for p in params], **kwargs)
    older.load_state_dict(old_format)
    assert older._families[0].state.factor_bounds is None
    run(older, older.param_groups[0]["params"], grads[:2])
    assert all(b is not None for b in older._families[0].state.factor_bounds)


def test_optax_carries_the_bounds_under_jit():
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax")
    from matroot.optim.optax import shampoo

    with jax.enable_x64(True):
        hyper = dict(block_size=16, precondition_frequency=1, root_method="newton_db",
                     weight_decay=0.0, precondition_1d=True, root_options=ADAPTIVE)
        config = ShampooConfig(lr=1.0, keep_roots=True, **hyper)
        opt = shampoo(1.0, **hyper)
        grads = _gradients(5, 5, np.float64)
        params = [np.zeros(s) for s in SHAPES]
        jx_state = opt.init([jax.numpy.asarray(p) for p in params])
        np_state = init(params, config)
        step = jax.jit(opt.update)
        for g in grads:
            jx_updates, jx_state = step([jax.numpy.asarray(x) for x in g], jx_state)
            np_updates, np_state = update(g, np_state, params, config)
            # Both carry the same bounds; their choice to use them may differ only
            # where a bound sits on the slack's edge: the roots' accuracy either way.
            tolerance = _update_tolerance(np_state, config.matrix_eps)
            for u, v in zip(jx_updates, np_updates):
                assert np.linalg.norm(np.asarray(u) - v) <= tolerance * np.linalg.norm(v)
        core_state = np_state._replace(factor_bounds=[np.asarray(b) for b in
                                                      jx_state[0].factor_bounds])
        for matrices, bounds in _factor_matrices(core_state._replace(
                factors=[np.asarray(f) for f in jx_state[0].factors])):
            assert np.all(np.linalg.eigvalsh(matrices)[:, -1] <= bounds[:, factor_bounds.UPPER])
