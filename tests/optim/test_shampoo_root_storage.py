"""Where Shampoo keeps its roots: 16-bit root storage, roots not kept (solved each step),
and the planner's byte count of what the state holds."""

import io

import pytest

torch = pytest.importorskip("torch")

from matroot.optim import Shampoo, ShampooConfig  # noqa: E402
from matroot.optim.shampoo_core import core  # noqa: E402
from shampoo_torch_runs import every_step_run, linear_problem, run_steps, stored_run  # noqa: E402


def test_bfloat16_root_storage_halves_root_bytes_and_stays_close_to_float32():
    half, (w16, _), _ = stored_run("bfloat16")
    full, (w32, _), _ = stored_run(None)
    assert {r.dtype for r in half._families[0].state.roots} == {torch.bfloat16}
    assert core.state_bytes(half._families[0].state)["roots"] * 2 == \
        core.state_bytes(full._families[0].state)["roots"]
    # 8 steps at lr 1e-2: the parameters move by ~8e-2; 16-bit roots change that by < 2 %.
    moved = (w32 - linear_problem(8, rows=40, cols=12)[2]).norm()
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
    opt, params, (x, y) = stored_run("bfloat16", steps=5)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    twins = [p.detach().clone().requires_grad_() for p in params]
    resumed = Shampoo(twins, lr=1e-2, block_size=32, precondition_frequency=2,
                      root_storage_dtype="bfloat16")
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    run_steps(params, opt, x, y, 4)
    run_steps(twins, resumed, x, y, 4)
    for p, q in zip(params, twins):
        assert torch.equal(p, q)


@pytest.mark.parametrize("packed", [False, True])
def test_roots_not_kept_hold_no_root_bytes_and_give_the_kept_roots_updates(packed):
    kept, kept_params, _ = every_step_run(True, 5, symmetric_packing=packed)
    dropped, params, _ = every_step_run(False, 5, symmetric_packing=packed)
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
    kept, kept_params, _ = every_step_run(True, 1, **failing)
    dropped, params, _ = every_step_run(False, 1, **failing)
    failures = dropped._families[0].state.root_failures
    assert [f.tolist() for f in failures] == \
        [f.tolist() for f in kept._families[0].state.root_failures]
    assert all(bool((f == 1).all()) for f in failures)
    for p, q in zip(params, kept_params):
        assert torch.equal(p, q) and bool(torch.isfinite(p).all())


def test_roots_not_kept_resume_bit_identically_and_load_into_kept_roots():
    opt, params, (x, y) = every_step_run(False, 3, symmetric_packing=True)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    twins = {keep: [p.detach().clone().requires_grad_() for p in params] for keep in (False, True)}
    for keep, ps in twins.items():
        resumed = Shampoo(ps, lr=1e-2, block_size=32, precondition_frequency=1,
                          precondition_1d=True, keep_roots=keep, symmetric_packing=True)
        buffer.seek(0)
        resumed.load_state_dict(torch.load(buffer, weights_only=True))
        run_steps(ps, resumed, x, y, 3)
    run_steps(params, opt, x, y, 3)
    assert all(torch.equal(p, q) for p, q in zip(params, twins[False]))
    for p, q in zip(params, twins[True]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_roots_refreshed_every_step_are_not_kept_by_default():
    """keep_roots=None (the default) drops roots that are solved at every step: it is
    keep_roots=False (bitwise: the same program on the same inputs), whose updates the
    test above holds equal to kept roots'."""
    auto, auto_params, _ = every_step_run(None, 4)
    dropped, dropped_params, _ = every_step_run(False, 4)
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
