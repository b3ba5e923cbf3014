"""The functional Shampoo core on NumPy, array-api-strict and torch arrays.

The reference is a plain float64 NumPy loop over blocks with eigh roots, written
from the update's definition (see matroot/optim/shampoo_core/core.py), independent of the
block plan and the stacks.
"""

import math

import numpy as np
import pytest

import matroot.optim.shampoo_core.preconditioner as preconditioner
from matroot.optim import ShampooConfig, apply_updates, copy_state, init, state_bytes, update
from matroot.optim.shampoo_core.core import NonFiniteGradientError

SHAPES = [(37, 21), (6, 3, 2, 2), (9,), ()]
#: Views the reference uses: the conv kernel as (out, in·kh·kw).
VIEWS = [(37, 21), (6, 12), (9,), ()]


def _problem(seed, steps, shapes=SHAPES, dtype=np.float64, rank=None):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = []
    for _ in range(steps):
        step = []
        for s in shapes:
            g = rng.standard_normal(s)
            if rank is not None and len(s) == 2:
                g = rng.standard_normal((s[0], rank)) @ rng.standard_normal((rank, s[1]))
            step.append(g.astype(dtype))
        grads.append(step)
    return params, grads


def _inv_root(a, p, eps):
    lam, q = np.linalg.eigh(a + eps * np.eye(a.shape[0]))
    return (q * lam ** (-1.0 / p)) @ q.T


def _ranges(n, size):
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def reference_run(params, grads_seq, cfg):
    """Blocked Shampoo with Adam grafting, one block at a time, float64."""
    beta1, beta2 = cfg["betas"]
    params = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    blocks = {}
    start, freq = cfg["start"], cfg["freq"]
    trajectory = []
    for t, grads in enumerate(grads_seq, start=1):
        new_params = []
        for i, (p, g) in enumerate(zip(params, grads)):
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat = m[i] / (1 - beta1 ** t)
            adam = m_hat / (np.sqrt(v[i] / (1 - beta2 ** t)) + cfg["eps"])
            direction = adam.copy()
            view = VIEWS[i]
            matrix = len(view) == 2
            if matrix or (len(view) == 1 and cfg["precondition_1d"]):
                gv, mv, av = g.reshape(view), m_hat.reshape(view), adam.reshape(view)
                dv = np.zeros(view)
                cols = _ranges(view[1], cfg["block_size"]) if matrix else [None]
                for r in _ranges(view[0], cfg["block_size"]):
                    for c in cols:
                        idx = (slice(*r), slice(*c)) if matrix else (slice(*r),)
                        gb = gv[idx] if matrix else gv[idx][:, None]
                        key = (i, r, c)
                        if key not in blocks:
                            blocks[key] = dict(L=0 * gb @ gb.T, R=0 * gb.T @ gb,
                                               Lr=np.eye(gb.shape[0]), Rr=np.eye(gb.shape[1]))
                        b = blocks[key]
                        b["L"] = beta2 * b["L"] + (1 - beta2) * gb @ gb.T
                        b["R"] = beta2 * b["R"] + (1 - beta2) * gb.T @ gb
                        if t >= start and (t - start) % freq == 0:
                            b["Lr"] = _inv_root(b["L"], 4 if matrix else 2, cfg["matrix_eps"])
                            if matrix:
                                b["Rr"] = _inv_root(b["R"], 4, cfg["matrix_eps"])
                        if matrix:
                            sh = b["Lr"] @ mv[idx] @ b["Rr"]
                        else:
                            sh = b["Lr"] @ mv[idx]
                        dv[idx] = sh * np.linalg.norm(av[idx]) / np.linalg.norm(sh)
                if t >= start:
                    direction = dv.reshape(p.shape)
            new_params.append(p - cfg["lr"] * (direction + cfg["weight_decay"] * p))
        params = new_params
        trajectory.append(params)
    return trajectory


REFERENCE_CFG = dict(lr=0.02, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, block_size=8,
                     start=2, freq=3, matrix_eps=1e-3, precondition_1d=True)


def _config(cfg, **overrides):
    kwargs = dict(lr=cfg["lr"], betas=cfg["betas"], eps=cfg["eps"],
                  weight_decay=cfg["weight_decay"], block_size=cfg["block_size"],
                  start_preconditioning_step=cfg["start"],
                  precondition_frequency=cfg["freq"], matrix_eps=cfg["matrix_eps"],
                  precondition_1d=cfg["precondition_1d"], root_method="evd")
    kwargs.update(overrides)
    return ShampooConfig(**kwargs)


def _run(xp, params, grads_seq, config, to_numpy=np.asarray, **update_kwargs):
    params = [xp.asarray(p) for p in params]
    state = init(params, config)
    trajectory = []
    for grads in grads_seq:
        updates, state = update([xp.asarray(g) for g in grads], state, params, config,
                                **update_kwargs)
        params = apply_updates(params, updates)
        trajectory.append([to_numpy(p) for p in params])
    return trajectory, state


def test_float64_core_matches_the_blockwise_reference():
    params, grads = _problem(0, 8)
    expected = reference_run(params, grads, REFERENCE_CFG)
    got, state = _run(np, params, grads, _config(REFERENCE_CFG))
    for step_got, step_expected in zip(got, expected):
        for a, b in zip(step_got, step_expected):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert state.root_refreshes == 3  # steps 2, 5, 8
    assert all(int(np.sum(f)) == 0 for f in state.root_failures)
    # The preconditioned run is not the Adam run.
    adam_only, _ = _run(np, params, grads, _config(REFERENCE_CFG, start_preconditioning_step=100))
    assert np.max(np.abs(adam_only[-1][0] - got[-1][0])) > 1e-3


def test_nesterov_and_adagrad_grafting_follow_their_formulas():
    params, grads = _problem(1, 3, shapes=[(5,)])
    config = ShampooConfig(lr=0.1, betas=(0.8, 0.9), grafting_beta2=1.0, nesterov=True,
                           weight_decay=0.0, eps=1e-6)
    got, _ = _run(np, params, grads, config)
    p, m, v = params[0].copy(), np.zeros(5), np.zeros(5)
    for t, (g,) in enumerate(grads, start=1):
        m = 0.8 * m + 0.2 * g
        v = v + g * g
        first = (0.8 * m + 0.2 * g) / (1 - 0.8 ** t)
        p = p - 0.1 * first / (np.sqrt(v) + 1e-6)
    np.testing.assert_allclose(got[-1][0], p, rtol=1e-12)


@pytest.mark.parametrize("method", ["evd", "newton_db"])
def test_stacked_and_per_block_solves_give_the_same_updates(method):
    params, grads = _problem(2, 6, shapes=[(40, 24), (24, 40), (24, 24), (3, 8, 3)],
                             dtype=np.float32)
    kwargs = dict(lr=0.01, block_size=16, precondition_frequency=2, root_method=method,
                  matrix_eps=1e-4)
    stacked, s_state = _run(np, params, grads, ShampooConfig(**kwargs))
    single, u_state = _run(np, params, grads, ShampooConfig(stacked=False, **kwargs))
    assert len(s_state.plan.stacks) < len(u_state.plan.stacks)
    for a, b in zip(stacked[-1], single[-1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_one_solver_call_per_distinct_factor_size(monkeypatch):
    calls = []
    real = preconditioner.inv_root_info

    def counting(a, p, **kwargs):
        calls.append((tuple(a.shape), p))
        return real(a, p, **kwargs)

    monkeypatch.setattr(preconditioner, "inv_root_info", counting)
    shapes = [(48, 48), (48, 16), (16, 48), (50, 16), (8, 2, 3, 3), (48,)]
    params, grads = _problem(3, 1, shapes=shapes, dtype=np.float32)
    config = ShampooConfig(block_size=16, precondition_frequency=1, precondition_1d=True)
    _run(np, params, grads, config)
    # Factor sizes: 16 (matrix blocks), 2 (50 = 16+16+16+2 rows), 16 and 9 (the
    # conv kernel's balanced view 16x9), and 16 for the vector chunks (root 2).
    sizes = sorted((shape[1], p) for shape, p in calls)
    assert sizes == [(2, 4), (9, 4), (16, 2), (16, 4)]
    blocks = 9 + 3 + 3 + 4 + 1
    assert sum(shape[0] for shape, p in calls if p == 4) == 2 * blocks
    calls.clear()
    _run(np, params, grads, ShampooConfig(block_size=16, precondition_frequency=1,
                                          precondition_1d=True, stacked=False))
    assert len(calls) == 2 * blocks + 3


@pytest.mark.parametrize("backend", ["array_api_strict", "torch"])
def test_other_backends_give_numpy_updates(backend):
    xp = pytest.importorskip(backend)
    params, grads = _problem(4, 5, shapes=[(20, 12), (4, 3, 3), (12,)], dtype=np.float32)
    config = ShampooConfig(lr=0.01, block_size=8, precondition_frequency=2,
                           precondition_1d=True, root_method="evd", matrix_eps=1e-4)
    expected, _ = _run(np, params, grads, config)
    if backend == "torch":
        got, state = _run(xp, [xp.from_numpy(p) for p in params],
                          [[xp.from_numpy(g) for g in step] for step in grads], config,
                          to_numpy=lambda t: t.numpy())
    else:
        got, state = _run(xp, params, grads, config, to_numpy=lambda a: np.asarray(a))
    assert state.root_refreshes == 2
    for a, b in zip(got[-1], expected[-1]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_failed_roots_keep_their_previous_value_and_are_counted():
    # Rank-1 gradients with no ridge: the factors are singular, eigh finds
    # eigenvalues <= 0 and inv_root returns NaN for them.
    rng = np.random.default_rng(5)
    params = [rng.standard_normal((12, 8)), rng.standard_normal((6, 6))]
    config = ShampooConfig(lr=0.01, block_size=16, precondition_frequency=1, matrix_eps=0.0,
                           root_method="evd", weight_decay=0.0, keep_roots=True,
                           symmetric_packing=False)
    state = init(params, config)
    for _ in range(3):
        grads = [np.outer(rng.standard_normal(12), rng.standard_normal(8)),
                 rng.standard_normal((6, 6))]
        updates, state = update(grads, state, params, config)
        assert all(np.all(np.isfinite(u)) for u in updates)
        params = apply_updates(params, updates)
    stacks = {s.size: i for i, s in enumerate(state.plan.stacks)}
    # The 12x8 block's factors (sizes 12 and 8) failed every time and are still I;
    # the full-rank 6x6 block's factors succeeded.
    for size in (12, 8):
        i = stacks[size]
        assert state.root_failures[i].tolist() == [3]
        np.testing.assert_array_equal(state.roots[i][0], np.eye(size))
    assert state.root_failures[stacks[6]].tolist() == [0, 0]
    assert not np.allclose(state.roots[stacks[6]][0], np.eye(6))


def test_unconverged_roots_are_rejected():
    params, grads = _problem(6, 2, shapes=[(10, 10)])
    config = ShampooConfig(precondition_frequency=1, root_method="newton_db",
                           root_options={"max_iter": 1}, matrix_eps=1e-6, keep_roots=True,
                           symmetric_packing=False)
    _, state = _run(np, params, grads, config)
    assert state.root_failures[0].tolist() == [2, 2]
    np.testing.assert_array_equal(state.roots[0], np.broadcast_to(np.eye(10), (2, 10, 10)))


@pytest.mark.parametrize("matrix_eps", [0.0, 1e-6])
def test_zero_gradients_at_step_one_leave_only_weight_decay(matrix_eps):
    params = [np.full((5, 4), 2.0), np.ones(3)]
    config = ShampooConfig(lr=0.1, weight_decay=0.5, precondition_frequency=1,
                           matrix_eps=matrix_eps)
    state = init(params, config)
    updates, state = update([np.zeros((5, 4)), np.zeros(3)], state, params, config)
    np.testing.assert_array_equal(updates[0], np.full((5, 4), -0.1 * 0.5 * 2.0))
    np.testing.assert_array_equal(updates[1], np.full(3, -0.1 * 0.5))


def test_nonfinite_gradient_raises_or_skips():
    params, grads = _problem(7, 1, shapes=[(4, 3), (3,)])
    bad = [grads[0][0].copy(), grads[0][1].copy()]
    bad[1][2] = np.nan
    config = ShampooConfig()
    state = init(params, config)
    with pytest.raises(NonFiniteGradientError, match=r"parameters \[1\]"):
        update(bad, state, params, config)
    skip = ShampooConfig(nonfinite_grads="skip")
    before = copy_state(state)
    updates, after = update(bad, state, params, skip)
    assert after.skipped_steps == 1 and after.step == 0
    assert all(np.all(u == 0) for u in updates)
    for a, b in zip(before.exp_avg + before.factors, after.exp_avg + after.factors):
        np.testing.assert_array_equal(a, b)


def test_missing_gradients_leave_their_parameter_and_state_alone():
    params, grads = _problem(8, 2, shapes=[(8, 8), (8, 8), (5,)], dtype=np.float32)
    config = ShampooConfig(block_size=4, precondition_frequency=1)
    state = init(params, config)
    _, state = update(grads[0], state, params, config)
    before = copy_state(state)
    updates, state = update([grads[1][0], None, grads[1][2]], state, params, config)
    assert updates[1] is None and state.param_steps == (2, 1, 2)
    np.testing.assert_array_equal(before.exp_avg[1], state.exp_avg[1])
    # The second parameter's factors (its run of slots) are unchanged, the first's moved.
    first = state.plan.groups[0]
    owner = [b.param for b in first.blocks]
    stack, slot = first.left
    for j, p in enumerate(owner):
        same = np.array_equal(before.factors[stack][slot + j], state.factors[stack][slot + j])
        assert same == (p == 1)


def test_state_bytes_counts_moments_factors_and_roots():
    params = [np.zeros((100, 30), dtype=np.float32), np.zeros(30, dtype=np.float32)]
    state = init(params, ShampooConfig(block_size=64, symmetric_packing=False))
    sizes = state_bytes(state)
    assert sizes["moments"] == 2 * 4 * (3000 + 30)
    factor_elems = 64 * 64 + 36 * 36 + 2 * 30 * 30
    assert sizes["factors"] == sizes["roots"] == 4 * factor_elems
    assert sizes["per_parameter"] == pytest.approx(sizes["total"] / 3030)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=-1.0), "lr"), (dict(betas=(1.0, 0.9)), r"betas\[0\]"),
    (dict(betas=(0.9, 1.5)), r"betas\[1\]"), (dict(betas=(0.9,)), "pair"),
    (dict(eps=math.nan), "eps"), (dict(block_size=0), "block_size"),
    (dict(precondition_frequency=0), "precondition_frequency"),
    (dict(start_preconditioning_step=0), "start_preconditioning_step"),
    (dict(root_method="cholesky"), "root_method"), (dict(matrix_eps=-1e-3), "matrix_eps"),
    (dict(root_options={"eps": 1.0}), "root_options"), (dict(nonfinite_grads="ignore"),
                                                       "nonfinite_grads"),
    (dict(grafting_beta2=2.0), "grafting_beta2"),
    # Solver options are checked when the config is made, not at the first refresh.
    (dict(root_options={"max_iter": 0}), "max_iter"),
    (dict(root_options={"scaling": "trace"}), "scaling"),
    (dict(root_options={"matmul_dtype": "float8"}), "matmul_dtype"),
    (dict(root_options={"tol": -1.0}), "tol"),
])
def test_bad_hyperparameters_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShampooConfig(**kwargs)


def test_integer_parameters_are_rejected():
    with pytest.raises(TypeError, match="real floating"):
        init([np.zeros((3, 3), dtype=np.int64)], ShampooConfig())


def test_a_storage_dtype_the_array_library_lacks_is_named_with_the_fix():
    from matroot.optim import ShampooConfig, init

    with pytest.raises(ValueError, match="bfloat16 exists in PyTorch and JAX"):
        init([np.zeros((4, 4))], ShampooConfig(root_storage_dtype="bfloat16"), lazy=True)


def test_root_options_are_one_typed_value_from_a_dict_or_itself():
    from matroot.optim import RootOptions

    typed = ShampooConfig(root_options=RootOptions(tol=0, max_iter=10))
    assert typed == ShampooConfig(root_options={"tol": 0, "max_iter": 10})
    assert typed.root_options.keywords() == {"tol": 0.0, "max_iter": 10}
    assert ShampooConfig().root_options == RootOptions()
    with pytest.raises(TypeError, match="RootOptions or a dict"):
        ShampooConfig(root_options=[("tol", 0)])


def test_option_groups_are_built_once_and_build_the_same_config():
    from matroot.optim.shampoo_core.option_groups import (
        BlockingOptions,
        GraftingOptions,
        RootSolveOptions,
        StorageOptions,
    )

    flat = ShampooConfig(grafting="rmsprop", grafting_beta2=0.99, eps=1e-6, block_size=64,
                         skip_dims=[1], root_method="newton_db", matrix_eps=1e-5,
                         root_options={"max_iter": 40}, precondition_frequency=1,
                         symmetric_packing=True, lr=0.1)
    grouped = ShampooConfig.from_groups(
        GraftingOptions(grafting="rmsprop", grafting_beta2=0.99, eps=1e-6),
        BlockingOptions(block_size=64, skip_dims=(1,)),
        RootSolveOptions(root_method="newton_db", matrix_eps=1e-5,
                         root_options={"max_iter": 40}, precondition_frequency=1),
        StorageOptions(symmetric_packing=True), lr=0.1)
    assert grouped == flat
    assert flat.blocking == BlockingOptions(block_size=64, skip_dims=(1,))
    assert flat.root_solve.root_options.max_iter == 40
    assert not flat.keeps_roots and flat.second_moment_beta == 0.99
    with pytest.raises(ValueError, match="given both"):
        ShampooConfig.from_groups(BlockingOptions(block_size=64), block_size=32)
    with pytest.raises(TypeError, match="option groups"):
        ShampooConfig.from_groups({"block_size": 64})


@pytest.mark.parametrize("make, match", [
    (lambda g: g.GraftingOptions(grafting="lion"), "grafting"),
    (lambda g: g.BlockingOptions(skip_dims=(2,)), "skip_dims"),
    (lambda g: g.RootSolveOptions(precondition_frequency=0), "precondition_frequency"),
    (lambda g: g.StorageOptions(keep_roots=False, root_storage_dtype="float16"),
     "root_storage_dtype"),
])
def test_each_option_group_checks_itself_under_the_config_keyword(make, match):
    from matroot.optim.shampoo_core import option_groups

    with pytest.raises(ValueError, match=match):
        make(option_groups)
