"""Shampoo's state dict: the per-parameter layout index, packed factors and roots, loading
checkpoints of older formats and defaults, and root options that load weights-only."""

import io
import math

import pytest

torch = pytest.importorskip("torch")

from matroot.optim import Shampoo  # noqa: E402
from matroot.optim.shampoo_core import core  # noqa: E402
from shampoo_torch_runs import linear_problem, run_steps, stored_run  # noqa: E402


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
    x, y, w, b = linear_problem(10)
    opt = Shampoo([w, b], lr=1e-2, block_size=16, precondition_frequency=2)
    run_steps((w, b), opt, x, y, 3)
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
    run_steps((w, b), opt, x, y, 3)
    run_steps(twins, resumed, x, y, 3)
    assert all(torch.equal(p, q) for p, q in zip((w, b), twins))


def test_packed_factors_and_roots_hold_the_same_values_in_about_half_the_bytes():
    full, (w, b), (x, y) = stored_run(None, steps=6)
    opt = Shampoo(twins := [p.detach().clone().requires_grad_() for p in linear_problem(
        8, rows=40, cols=12)[2:]], lr=1e-2, block_size=32, precondition_frequency=2,
        symmetric_packing=True)
    run_steps(twins, opt, x, y, 6)
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
    run_steps(twins, opt, x, y, 3)
    run_steps(again, resumed, x, y, 3)
    assert all(torch.equal(p, q) for p, q in zip(twins, again))


def test_a_state_dict_saved_under_the_old_defaults_loads_and_continues_unchanged():
    """Before packing and the factor-ratio rule became defaults, a state dict held full
    stacks, every factor, and groups without ``max_factor_ratio``. Loaded into an
    optimizer made with today's defaults it keeps its saved settings (torch restores a
    group's hyperparameters) and layout: the next steps are the saver's own (bitwise:
    the same program on the same inputs)."""
    x, y, w, b = linear_problem(8, rows=200, cols=6)
    old = dict(symmetric_packing=False, max_factor_ratio=math.inf)
    saver = Shampoo([w, b], lr=1e-2, block_size=32, precondition_frequency=2, **old)
    run_steps((w, b), saver, x, y, 4)
    saved = saver.state_dict()
    for group in saved["param_groups"]:
        del group["max_factor_ratio"]
    twins = [p.detach().clone().requires_grad_() for p in (w, b)]
    loader = Shampoo(twins, lr=1e-2, block_size=32, precondition_frequency=2)
    # Today's defaults would leave the 200-row side of the 200×6 weight unfactored.
    assert not core.make_plan([w.detach()], core.ShampooConfig(block_size=32)).params[0].sides[0]
    loader.load_state_dict(saved)
    run_steps((w, b), saver, x, y, 4)
    run_steps(twins, loader, x, y, 4)
    assert all(torch.equal(p, q) for p, q in zip(twins, (w, b)))
    assert loader._families[0].state.plan == saver._families[0].state.plan


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
