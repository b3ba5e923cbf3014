"""Shampoo's controls: lazy state, per-dimension policies, grafting/update variants, storage,
and the state dict's per-parameter index."""

import io
import math

import numpy as np
import pytest
from hang_guard import HANG_GUARD_S
from rounding import relative_distance, rounding_tolerance

torch = pytest.importorskip("torch")

import matroot  # noqa: E402
from matroot.optim import Shampoo, ShampooConfig, init, update  # noqa: E402
from matroot.optim.shampoo_core import core  # noqa: E402

NEVER = 10**9


def _linear_problem(seed, rows=24, cols=6, batch=32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, cols, generator=g), torch.randn(batch, rows, generator=g),
            torch.nn.Parameter(torch.randn(rows, cols, generator=g) / 3),
            torch.nn.Parameter(torch.randn(rows, generator=g) / 3))


def _steps(params, opt, x, y, steps):
    w, b = params
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(x @ w.T + b, y).backward()
        opt.step()


# --- lazy state -----------------------------------------------------------------------------

def test_frozen_and_unused_parameters_hold_no_state():
    x, y, w, b = _linear_problem(0)
    frozen = torch.nn.Parameter(torch.randn(500, 64), requires_grad=False)
    unused = torch.nn.Parameter(torch.randn(40, 40))
    opt = Shampoo([w, b, frozen, unused], block_size=64, precondition_frequency=2)
    _steps((w, b), opt, x, y, 5)
    assert frozen not in opt.state and unused not in opt.state
    assert set(opt.state) == {w, b}
    plan = opt._families[0].state.plan
    assert len(plan.params) == 3                      # the frozen one is not even planned
    # The 40x40 parameter's stack (size 40) was never allocated: no gradient reached it.
    sizes = {s.size: f for s, f in zip(plan.stacks, opt._families[0].state.factors)}
    assert sizes[40] is None and sizes[6] is not None
    assert opt.diagnostics()["state_bytes"] == core.state_bytes(opt._families[0].state)["total"]


def test_lazy_core_state_allocates_at_the_first_gradient_and_matches_eager():
    rng = np.random.default_rng(1)
    params = [rng.standard_normal((12, 5)), rng.standard_normal(5)]
    config = ShampooConfig(lr=0.05, precondition_frequency=2, block_size=8)
    lazy, eager = init(params, config, lazy=True), init(params, config)
    assert lazy.exp_avg == [None, None] and all(f is None for f in lazy.factors)
    assert core.state_bytes(lazy)["total"] == 0
    for _ in range(4):
        grads = [rng.standard_normal(p.shape) for p in params]
        u_lazy, lazy = update(grads, lazy, params, config)
        u_eager, eager = update(grads, eager, params, config)
        for a, b in zip(u_lazy, u_eager):
            np.testing.assert_array_equal(a, b)
    assert core.state_bytes(lazy) == core.state_bytes(eager)


def test_a_group_that_never_preconditions_allocates_no_factors():
    x, y, w, b = _linear_problem(2)
    opt = Shampoo([{"params": [w, b], "precondition": False}], lr=1e-2)
    ref = torch.optim.AdamW([p.detach().clone().requires_grad_() for p in (w, b)], lr=1e-2)
    _steps((w, b), opt, x, y, 12)
    _steps(ref.param_groups[0]["params"], ref, x, y, 12)
    family = opt._families[0]
    assert family.state.plan.stacks == () and opt.diagnostics()["stacks"] == 0
    for p, q in zip((w, b), ref.param_groups[0]["params"]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


# --- per-dimension control ------------------------------------------------------------------

def _one_sided_reference(grad, beta2, eps, matrix_eps):
    """Step 1 of one-sided (columns) Shampoo with Adam grafting, float64, from definitions."""
    g = grad.double()
    factor = (1 - beta2) * g.T @ g + matrix_eps * torch.eye(g.shape[1], dtype=torch.float64)
    vals, vecs = torch.linalg.eigh(factor)
    direction = g @ (vecs * vals ** -0.5) @ vecs.T
    adam = g / (g.abs() + eps)
    return direction * (adam.norm() / direction.norm())


@pytest.mark.parametrize("policy", [dict(max_preconditioned_dim=100), dict(skip_dims=(0,))])
def test_one_sided_embedding_gets_only_its_small_side_and_follows_the_definition(policy):
    gen = torch.Generator().manual_seed(3)
    emb = torch.nn.Parameter(torch.randn(300, 8, generator=gen, dtype=torch.float64))
    opt = Shampoo([emb], lr=0.1, weight_decay=0.0, block_size=64, precondition_frequency=1,
                  root_method="evd", matrix_eps=1e-6, **policy)
    grad = torch.randn(300, 8, generator=gen, dtype=torch.float64)
    emb.grad = grad.clone()
    before = emb.detach().clone()
    opt.step()
    stacks = opt._families[0].state.plan.stacks
    assert [(s.size, s.root, s.count) for s in stacks] == [(8, 2, 1)]   # rows not cut
    expected = -0.1 * _one_sided_reference(grad, 0.999, 1e-8, 1e-6)
    torch.testing.assert_close(emb.detach() - before, expected, rtol=1e-9, atol=1e-12)


def test_one_sided_embedding_state_is_within_1_2x_of_adamw():
    emb = torch.nn.Parameter(torch.zeros(50000, 64))
    opt = Shampoo([emb], max_preconditioned_dim=4096, precondition_frequency=1)
    emb.grad = torch.randn(50000, 64) * 1e-2
    opt.step()
    adamw_bytes = 2 * emb.numel() * 4
    assert opt.diagnostics()["state_bytes"] <= 1.2 * adamw_bytes


def test_infinite_block_size_preconditions_each_parameter_whole():
    x, y, w, b = _linear_problem(4, rows=70, cols=9)
    opt = Shampoo([w, b], block_size=math.inf, precondition_frequency=2)
    _steps((w, b), opt, x, y, 3)
    plan = opt._families[0].state.plan
    assert [len(g.blocks) for g in plan.groups] == [1]
    assert sorted(s.size for s in plan.stacks) == [9, 70]


def test_graft_only_parameters_follow_adamw_and_policies_share_one_call_per_size(monkeypatch):
    calls = []
    solve = matroot.optim.shampoo_core.preconditioner.inv_root_info

    def counting(a, p, **kwargs):
        calls.append((tuple(a.shape), p))
        return solve(a, p, **kwargs)

    monkeypatch.setattr(matroot.optim.shampoo_core.preconditioner, "inv_root_info", counting)
    gen = torch.Generator().manual_seed(5)
    kept = torch.nn.Parameter(torch.randn(16, 16, generator=gen))
    one_sided = torch.nn.Parameter(torch.randn(400, 16, generator=gen))
    adam_only = torch.nn.Parameter(torch.randn(16, 16, generator=gen))
    twin = adam_only.detach().clone().requires_grad_()
    opt = Shampoo([{"params": [kept, adam_only]},
                   {"params": [one_sided], "max_preconditioned_dim": 64, "lr": 5e-3}],
                  lr=1e-2, precondition_frequency=1, graft_only=lambda p: p is adam_only)
    ref = torch.optim.AdamW([twin], lr=1e-2)
    for _ in range(3):
        for p in (kept, one_sided, adam_only):
            p.grad = torch.randn(p.shape, generator=gen)
        twin.grad = adam_only.grad.clone()
        opt.step()
        ref.step()
    assert len(opt._families) == 1                  # per-parameter policies share stacks
    assert sorted(calls) == sorted([((2, 16, 16), 4), ((1, 16, 16), 2)] * 3)
    torch.testing.assert_close(adam_only, twin, rtol=1e-5, atol=1e-6)


def test_bad_policies_are_rejected():
    with pytest.raises(ValueError, match="skip_dims"):
        ShampooConfig(skip_dims=(2,))
    with pytest.raises(ValueError, match="max_preconditioned_dim"):
        ShampooConfig(max_preconditioned_dim=0)
    with pytest.raises(ValueError, match="block_size"):
        ShampooConfig(block_size=-math.inf)


# --- grafting and update options against their elementwise definitions ---------------------

def _pure(**options):
    """Shampoo reduced to its grafting update (no factors), and an equal twin parameter."""
    gen = torch.Generator().manual_seed(6)
    p = torch.nn.Parameter(torch.randn(7, 5, generator=gen))
    return p, p.detach().clone().requires_grad_(), gen, dict(precondition=False, **options)


@pytest.mark.parametrize("options, reference", [
    (dict(grafting="sgd", betas=(0.0, 0.999), momentum=0.9, weight_decay=0.1,
          weight_decay_type="l2"),
     lambda q: torch.optim.SGD([q], lr=0.05, momentum=0.9, weight_decay=0.1)),
    (dict(grafting="rmsprop", betas=(0.0, 0.999), grafting_beta2=0.9, weight_decay=0.0),
     lambda q: torch.optim.RMSprop([q], lr=0.05, alpha=0.9, eps=1e-8)),
    (dict(grafting="adagrad", betas=(0.0, 0.999), weight_decay=0.0),
     lambda q: torch.optim.Adagrad([q], lr=0.05, eps=1e-8)),
    (dict(weight_decay=0.1, weight_decay_type="l2"),
     lambda q: torch.optim.Adam([q], lr=0.05, weight_decay=0.1)),
    (dict(maximize=True, weight_decay=0.1),
     lambda q: torch.optim.AdamW([q], lr=0.05, weight_decay=0.1, maximize=True)),
])
def test_update_options_match_torch_optimizers(options, reference):
    p, q, gen, options = _pure(**options)
    opt, ref = Shampoo([p], lr=0.05, **options), reference(q)
    for _ in range(6):
        p.grad = torch.randn(p.shape, generator=gen)
        q.grad = p.grad.clone()
        opt.step()
        ref.step()
    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    if "grafting" in options:
        assert ("exp_avg_sq" in opt.state[p]) == (options["grafting"] != "sgd")


def test_momentum_and_maximize_apply_to_the_preconditioned_update():
    rng = np.random.default_rng(7)
    w = [rng.standard_normal((6, 4))]
    plain_cfg = ShampooConfig(lr=0.1, precondition_frequency=1, weight_decay=0.0)
    mom_cfg = ShampooConfig(lr=0.1, precondition_frequency=1, weight_decay=0.0, momentum=0.5)
    max_cfg = ShampooConfig(lr=0.1, precondition_frequency=1, weight_decay=0.0, maximize=True)
    plain, mom, maxi = init(w, plain_cfg), init(w, mom_cfg), init(w, max_cfg)
    previous = 0.0
    for _ in range(3):
        g = rng.standard_normal((6, 4))
        (u,), plain = update([g], plain, w, plain_cfg)
        (um,), mom = update([g], mom, w, mom_cfg)
        (ux,), maxi = update([-g], maxi, w, max_cfg)
        previous = 0.5 * previous + u      # u = -lr·d, so the buffer's update is linear
        np.testing.assert_allclose(um, previous, rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(ux, u)


# --- storage ------------------------------------------------------------------------------

def _stored(dtype, steps=8):
    x, y, w, b = _linear_problem(8, rows=40, cols=12)
    opt = Shampoo([w, b], lr=1e-2, block_size=32, precondition_frequency=2,
                  root_storage_dtype=dtype, symmetric_packing=False)
    _steps((w, b), opt, x, y, steps)
    return opt, (w, b), (x, y)


def test_bfloat16_root_storage_halves_root_bytes_and_stays_close_to_float32():
    half, (w16, _), _ = _stored("bfloat16")
    full, (w32, _), _ = _stored(None)
    assert {r.dtype for r in half._families[0].state.roots} == {torch.bfloat16}
    assert core.state_bytes(half._families[0].state)["roots"] * 2 == \
        core.state_bytes(full._families[0].state)["roots"]
    # 8 steps at lr 1e-2: the parameters move by ~8e-2; 16-bit roots change that by < 2 %.
    moved = (w32 - _linear_problem(8, rows=40, cols=12)[2]).norm()
    assert (w16 - w32).norm() < 0.02 * moved


@pytest.mark.parametrize("storage", [None, "float16"])
def test_a_root_that_overflows_its_storage_dtype_fails_and_falls_back(storage):
    """Gradients of 1e-12 make factors of 1e-27·I: their root, ~4.7e6·I, is exact in
    float32 and Inf in float16 (largest 65504), so with float16 storage every refresh
    fails, is counted, and the blocks keep their identity roots (the grafted Adam
    direction), as after a failed solve; nothing non-finite reaches the parameters."""
    w = torch.nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))
    opt = Shampoo([w], lr=1e-2, block_size=4, precondition_frequency=1,
                  start_preconditioning_step=1, matrix_eps=1e-27, root_storage_dtype=storage,
                  keep_roots=True, symmetric_packing=False)
    for _ in range(2):
        w.grad = 1e-12 * torch.eye(4)
        opt.step()
    roots = opt._families[0].state.roots
    failures = opt.diagnostics()["root_failures"]
    assert torch.isfinite(w).all() and all(torch.isfinite(r).all() for r in roots)
    if storage is None:
        assert failures == 0 and float(roots[0].max()) > 65504
    else:
        assert failures == 2 * 2          # two factors, two refreshes
        assert all(torch.equal(r.float(), torch.eye(4).expand_as(r)) for r in roots)


def test_bfloat16_root_storage_resumes_bit_identically():
    opt, params, (x, y) = _stored("bfloat16", steps=5)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    twins = [p.detach().clone().requires_grad_() for p in params]
    resumed = Shampoo(twins, lr=1e-2, block_size=32, precondition_frequency=2,
                      root_storage_dtype="bfloat16")
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    _steps(params, opt, x, y, 4)
    _steps(twins, resumed, x, y, 4)
    for p, q in zip(params, twins):
        assert torch.equal(p, q)


def _every_step(keep_roots, steps, **options):
    x, y, w, b = _linear_problem(9, rows=40, cols=12)
    opt = Shampoo([w, b], lr=1e-2, block_size=32, precondition_frequency=1,
                  precondition_1d=True, keep_roots=keep_roots, **options)
    _steps((w, b), opt, x, y, steps)
    return opt, (w, b), (x, y)


@pytest.mark.parametrize("packed", [False, True])
def test_roots_not_kept_hold_no_root_bytes_and_give_the_kept_roots_updates(packed):
    kept, kept_params, _ = _every_step(True, 5, symmetric_packing=packed)
    dropped, params, _ = _every_step(False, 5, symmetric_packing=packed)
    state = dropped._families[0].state
    assert state.roots == [None] * len(state.plan.stacks)
    assert core.state_bytes(state)["roots"] == 0
    assert core.state_bytes(kept._families[0].state)["roots"] > 0
    assert int(state.root_refreshes) == 5 and int(sum(f.sum() for f in state.root_failures)) == 0
    for p, q in zip(params, kept_params):
        if packed:      # packed storage makes a kept root exactly symmetric: rounding apart
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        else:           # the same root is used either way
            assert torch.equal(p, q)


def test_roots_not_kept_fall_back_to_the_identity_and_count_the_failure():
    """A root that fails its check: kept roots fall back to the previous one (the identity
    at the first refresh), roots not kept to the identity, so step 1 agrees bitwise."""
    failing = {"root_method": "newton_db", "root_options": {"max_iter": 1}}
    kept, kept_params, _ = _every_step(True, 1, **failing)
    dropped, params, _ = _every_step(False, 1, **failing)
    failures = dropped._families[0].state.root_failures
    assert [f.tolist() for f in failures] == \
        [f.tolist() for f in kept._families[0].state.root_failures]
    assert all(bool((f == 1).all()) for f in failures)
    for p, q in zip(params, kept_params):
        assert torch.equal(p, q) and bool(torch.isfinite(p).all())


def test_roots_not_kept_resume_bit_identically_and_load_into_kept_roots():
    opt, params, (x, y) = _every_step(False, 3, symmetric_packing=True)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    twins = {keep: [p.detach().clone().requires_grad_() for p in params] for keep in (False, True)}
    for keep, ps in twins.items():
        resumed = Shampoo(ps, lr=1e-2, block_size=32, precondition_frequency=1,
                          precondition_1d=True, keep_roots=keep, symmetric_packing=True)
        buffer.seek(0)
        resumed.load_state_dict(torch.load(buffer, weights_only=True))
        _steps(ps, resumed, x, y, 3)
    _steps(params, opt, x, y, 3)
    assert all(torch.equal(p, q) for p, q in zip(params, twins[False]))
    for p, q in zip(params, twins[True]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_roots_refreshed_every_step_are_not_kept_by_default():
    """keep_roots=None (the default) drops roots that are solved at every step: it is
    keep_roots=False (bitwise: the same program on the same inputs), whose updates the
    test above holds equal to kept roots'."""
    auto, auto_params, _ = _every_step(None, 4)
    dropped, dropped_params, _ = _every_step(False, 4)
    assert all(r is None for r in auto._families[0].state.roots)
    assert core.state_bytes(auto._families[0].state)["roots"] == 0
    assert all(torch.equal(p, q) for p, q in zip(auto_params, dropped_params))
    assert ShampooConfig(precondition_frequency=1, root_storage_dtype="bfloat16").keeps_roots
    assert ShampooConfig(precondition_frequency=2).keeps_roots
    with pytest.raises(ValueError, match="True, False or None"):
        ShampooConfig(keep_roots="auto")


def test_roots_not_kept_need_every_step_refreshes_and_no_root_storage_dtype():
    with pytest.raises(ValueError, match="precondition_frequency=1, got 10"):
        ShampooConfig(keep_roots=False)
    with pytest.raises(ValueError, match="leave it None"):
        ShampooConfig(keep_roots=False, precondition_frequency=1, root_storage_dtype="bfloat16")


@pytest.mark.parametrize("storage", [{}, {"symmetric_packing": True},
                                     {"symmetric_packing": True, "root_storage_dtype": "bfloat16"},
                                     {"keep_roots": False, "precondition_frequency": 1}])
def test_the_planner_counts_the_preconditioner_bytes_the_state_holds(storage):
    from matroot.optim.distributed.cluster_sizing import plan_summary

    shapes = [(40, 12), (12,), (300, 20), (20, 20)]
    config = ShampooConfig(block_size=32, precondition_1d=True, **storage)
    state = core.init([torch.zeros(s) for s in shapes], config)
    held = core.state_bytes(state)
    planned = plan_summary([(str(i), s) for i, s in enumerate(shapes)], block_size=32,
                           world_sizes=[1], precondition_1d=True,
                           symmetric_packing=config.symmetric_packing,
                           root_storage_dtype=config.root_storage_dtype,
                           keep_roots=config.keeps_roots)["worlds"][0]
    # Counters: failure counts and carried λmax bounds.
    assert planned["preconditioner"] == held["factors"] + held["roots"] + held["counters"]
    assert planned["moments"] == held["moments"]


def test_roots_not_kept_shard_and_consolidate_without_roots():
    from matroot.optim.distributed.core import consolidate_state_dicts, shard_state_dict

    opt, _, _ = _every_step(False, 2)
    sd = opt.state_dict()
    shards = [shard_state_dict(sd, 2, r) for r in (0, 1)]
    assert all(s["shampoo_families"][0]["roots"] == [None] * len(
        s["shampoo_families"][0]["factors"]) for s in shards)
    merged = consolidate_state_dicts(shards)["shampoo_families"][0]
    assert merged["roots"] == [None] * len(merged["factors"])
    for saved, again in zip(sd["shampoo_families"][0]["factors"], merged["factors"]):
        assert torch.equal(saved, again)


# --- state dict -----------------------------------------------------------------------------

def test_state_dict_layout_says_where_each_blocks_factors_are():
    gen = torch.Generator().manual_seed(9)
    a = torch.nn.Parameter(torch.randn(20, 12, generator=gen))
    c = torch.nn.Parameter(torch.randn(9, generator=gen))
    opt = Shampoo([a, c], block_size=8, betas=(0.9, 0.5), precondition_1d=True,
                  symmetric_packing=False)
    grads = [torch.randn(p.shape, generator=gen) for p in (a, c)]
    for p, g in zip((a, c), grads):
        p.grad = g
    opt.step()
    record = opt.state_dict()["shampoo_families"][0]
    seen = 0
    for entry, grad in zip(record["layout"], grads):
        for block in entry["blocks"]:
            index = (slice(*block["rows"]),) + (() if block["cols"] is None
                                                 else (slice(*block["cols"]),))
            g = grad[index]
            g = g[:, None] if g.ndim == 1 else g
            for side, stat in (("left", g @ g.T), ("right", g.T @ g)):
                if block[side] is not None:
                    stack, slot = block[side]
                    torch.testing.assert_close(record["factors"][stack][slot], 0.5 * stat)
                    seen += 1
    assert seen == 2 * 6 + 2            # 3x2 blocks of a (two factors each), 2 of c


def test_first_format_checkpoints_still_load():
    x, y, w, b = _linear_problem(10)
    opt = Shampoo([w, b], lr=1e-2, block_size=16, precondition_frequency=2)
    _steps((w, b), opt, x, y, 3)
    sd = opt.state_dict()
    for record in sd["shampoo_families"]:
        for key in ("format", "layout", "block_size", "stacked"):
            del record[key]
    for group in sd["param_groups"]:
        for key in ("grafting", "momentum", "maximize", "weight_decay_type",
                    "root_storage_dtype", "precondition", "max_preconditioned_dim", "skip_dims"):
            del group[key]
    twins = [p.detach().clone().requires_grad_() for p in (w, b)]
    resumed = Shampoo(twins, lr=1e-2, block_size=16, precondition_frequency=2)
    resumed.load_state_dict(sd)
    _steps((w, b), opt, x, y, 3)
    _steps(twins, resumed, x, y, 3)
    assert all(torch.equal(p, q) for p, q in zip((w, b), twins))


def test_packed_factors_and_roots_hold_the_same_values_in_about_half_the_bytes():
    full, (w, b), (x, y) = _stored(None, steps=6)
    opt = Shampoo(twins := [p.detach().clone().requires_grad_() for p in _linear_problem(
        8, rows=40, cols=12)[2:]], lr=1e-2, block_size=32, precondition_frequency=2,
        symmetric_packing=True)
    _steps(twins, opt, x, y, 6)
    packed_state, full_state = opt._families[0].state, full._families[0].state
    for spec, *stacks in zip(packed_state.plan.stacks, packed_state.factors,
                             full_state.factors, packed_state.roots, full_state.roots):
        rows, cols = torch.triu_indices(spec.size, spec.size)
        # Roots: float32 evd where it meets the table (1e-4 at these κ), from factors that
        # differ by rounding (packing makes them exactly symmetric).
        root_atol = 1e-4 * float(stacks[3].abs().amax())
        for (packed, full), atol in zip((stacks[:2], stacks[2:]), (1e-5, root_atol)):
            assert packed.shape == (spec.count, spec.size * (spec.size + 1) // 2)
            torch.testing.assert_close(packed, full[:, rows, cols], rtol=1e-4, atol=atol)
    for kind in ("factors", "roots"):
        ratio = core.state_bytes(packed_state)[kind] / core.state_bytes(full_state)[kind]
        assert ratio < 0.6
    for p, q in zip(twins, (w, b)):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    again = [p.detach().clone().requires_grad_() for p in twins]
    resumed = Shampoo(again, lr=1e-2, block_size=32, precondition_frequency=2,
                      symmetric_packing=True)
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    _steps(twins, opt, x, y, 3)
    _steps(again, resumed, x, y, 3)
    assert all(torch.equal(p, q) for p, q in zip(twins, again))


def test_a_state_dict_saved_under_the_old_defaults_loads_and_continues_unchanged():
    """Before packing and the factor-ratio rule became defaults, a state dict held full
    stacks, every factor, and groups without ``max_factor_ratio``. Loaded into an
    optimizer made with today's defaults it keeps its saved settings (torch restores a
    group's hyperparameters) and layout: the next steps are the saver's own (bitwise:
    the same program on the same inputs)."""
    x, y, w, b = _linear_problem(8, rows=200, cols=6)
    old = dict(symmetric_packing=False, max_factor_ratio=math.inf)
    saver = Shampoo([w, b], lr=1e-2, block_size=32, precondition_frequency=2, **old)
    _steps((w, b), saver, x, y, 4)
    saved = saver.state_dict()
    for group in saved["param_groups"]:
        del group["max_factor_ratio"]
    twins = [p.detach().clone().requires_grad_() for p in (w, b)]
    loader = Shampoo(twins, lr=1e-2, block_size=32, precondition_frequency=2)
    # Today's defaults would leave the 200-row side of the 200×6 weight unfactored.
    assert not core.make_plan([w.detach()], core.ShampooConfig(block_size=32)).params[0].sides[0]
    loader.load_state_dict(saved)
    _steps((w, b), saver, x, y, 4)
    _steps(twins, loader, x, y, 4)
    assert all(torch.equal(p, q) for p, q in zip(twins, (w, b)))
    assert loader._families[0].state.plan == saver._families[0].state.plan


def test_packed_lazy_state_dicts_shard_and_consolidate():
    from matroot.optim.distributed.core import consolidate_state_dicts, shard_state_dict

    gen = torch.Generator().manual_seed(11)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(20, 12), (9, 17)]]
    idle = torch.nn.Parameter(torch.randn(5, 7, generator=gen))      # never gets a gradient
    opt = Shampoo(params + [idle], distributed=None, block_size=8, precondition_frequency=2,
                  symmetric_packing=True, root_storage_dtype="bfloat16")
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    sd = opt.state_dict()
    record = sd["shampoo_families"][0]
    assert any(f is None for f in record["factors"])                 # the idle one's stacks
    back = consolidate_state_dicts([shard_state_dict(sd, 2, r) for r in (1, 0)])
    merged = back["shampoo_families"][0]
    for name in ("factors", "roots"):
        for saved, again in zip(record[name], merged[name]):
            if saved is not None:
                assert torch.equal(saved, again)
            else:                   # a fresh stack: zero factors, identity roots, packed
                assert again.ndim == 2 and again.dtype == (
                    torch.float32 if name == "factors" else torch.bfloat16)
                n = (math.isqrt(8 * again.shape[1] + 1) - 1) // 2
                fresh = torch.zeros if name == "factors" else torch.eye
                expected = fresh(n, n)[tuple(torch.triu_indices(n, n))]
                assert torch.equal(again.float(), expected.expand_as(again))


def test_a_dtensor_parameter_in_a_world_of_one_steps_like_a_plain_tensor(tmp_path):
    """No optimizer process group (a world of one): the DTensor path alone. The core runs
    the same program on the same whole tensors as for the plain parameter, and the
    update is added elementwise to the same values, so bit for bit."""
    import subprocess
    import sys

    script = f"""
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from matroot.optim import Shampoo
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
try:
    start = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    weight = torch.nn.Parameter(distribute_tensor(start.clone(),
                                                  init_device_mesh("cpu", (1,)), [Shard(0)]))
    plain = torch.nn.Parameter(start.clone())
    opts = [Shampoo([w], block_size=4, precondition_frequency=1, weight_decay=0.1)
            for w in (weight, plain)]
    for step in range(3):
        grad = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        weight.grad = distribute_tensor(grad, weight.device_mesh, [Shard(0)])
        plain.grad = grad
        for opt in opts:
            opt.step()
    print(torch.equal(weight.full_tensor(), plain.detach()))
finally:
    dist.destroy_process_group()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False, timeout=HANG_GUARD_S)
    assert out.stdout.strip() == "True", out.stdout + out.stderr


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_rank_keeps_moments_only_where_it_owns_elements_and_its_blocks_match_one_process(
        world):
    from matroot.optim import apply_updates, state_bytes
    from matroot.optim.distributed.rank_part import piece_plan, rank_pieces
    from matroot.optim.distributed.sharding import factor_bytes, shard_plan

    rng = np.random.default_rng(12)
    # Parameters of 3x3 and 2x3 blocks that the cuts fall inside at every world size
    # here (some ranks own a partial stripe of block rows), and a vector left to the
    # elementwise update.
    shapes = [(40, 48), (32, 48), (16, 8), (8,)]
    params = [rng.standard_normal(s) for s in shapes]
    config = ShampooConfig(lr=0.05, block_size=16, precondition_frequency=2, momentum=0.5,
                           root_method="evd", matrix_eps=1e-6)
    plan = core.make_plan(params, config)
    split = shard_plan(plan, world)
    pieces = [rank_pieces(plan, split, r) for r in range(world)]

    def parts(arrays, r):
        return [p.of(arrays[p.param], plan.params[p.param]) for p in pieces[r]]

    single = init(params, config, lazy=True)
    ranks = [init(parts(params, r), config, plan=piece_plan(plan, split, r, pieces[r]),
                  lazy=True) for r in range(world)]
    cut = {p.param for r in range(world) for p in pieces[r] if p.index is not None
           and p.shape != plan.params[p.param].view}
    assert cut, "some parameter must be cut between ranks"
    for _ in range(5):
        grads = [rng.standard_normal(s) for s in shapes]
        expected, single = update(grads, single, params, config)
        # What the all-gather does: every element from the one rank that owns it.
        assembled = [np.full(s, np.nan) for s in shapes]
        for r in range(world):
            updates, ranks[r] = update(parts(grads, r), ranks[r], parts(params, r), config)
            for piece, u in zip(pieces[r], updates):
                piece.of(assembled[piece.param], plan.params[piece.param])[...] = u
        # A rank solves a smaller stack than one process: another batch size, which
        # need not round alike; the updates agree to float64 rounding (κ ≤ λmax/matrix_eps).
        for got, want in zip(assembled, expected):
            assert relative_distance(got, want) <= rounding_tolerance("float64", 1e9, 16)
        params = apply_updates(params, expected)
    # Nothing is kept twice: the ranks' states add up to the single process's.
    per_rank = [state_bytes(state)["total"] for state in ranks]
    assert sum(per_rank) == state_bytes(single)["total"]
    # And they are balanced up to the granularity of the cut: one block (its factors and
    # its three moments, float64) more than a fair share at most.
    block = max(factor_bytes(g) + 3 * 8 * math.prod(g.shape) for g in plan.groups)
    assert max(per_rank) <= state_bytes(single)["total"] / world + block


def test_param_groups_hold_root_options_as_a_plain_dict_that_loads_weights_only():
    """torch.load(weights_only=True), as DCP loads, unpickles no matroot class."""
    params = [torch.nn.Parameter(torch.randn(6, 4))]
    opt = Shampoo(params, root_options={"max_iter": 30}, precondition_frequency=1,
                  distributed=None)
    assert opt.param_groups[0]["root_options"] == {"max_iter": 30}
    params[0].grad = torch.randn(6, 4)
    opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    again = Shampoo([torch.nn.Parameter(params[0].detach().clone())],
                    root_options={"max_iter": 30}, precondition_frequency=1, distributed=None)
    again.load_state_dict(loaded)
    assert again._group_config(again.param_groups[0]).root_options.max_iter == 30
