"""inv_root under ``torch.compile(fullgraph=True)``: one graph, no host reads.

Dynamo's tracing is what ``fullgraph`` checks, so these use the ``eager``
backend (inductor's code generation adds minutes on two cores and tests torch,
not matroot). Under compilation the loops are unrolled to ``max_iter`` steps
with per-matrix freezing, so the tests use a small fixed step count.
"""

from __future__ import annotations

import numpy as np
import pytest

import matroot

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("method,steps", [("newton_db", 3), ("coupled_newton", 3),
                                          ("minimax", 3), ("chebyshev", 8)])
def test_inv_root_compiles_to_one_graph(method, steps):
    torch._dynamo.reset()
    rng = np.random.default_rng(0)
    g = rng.standard_normal((3, 8, 8))
    a = torch.asarray(g @ g.transpose(0, 2, 1) + np.eye(8), dtype=torch.float32)
    options = dict(method=method, eps=1e-2, tol=0.0, max_iter=steps)
    compiled = torch.compile(lambda x: matroot.inv_root_info(x, 4, **options),
                             fullgraph=True, backend="eager")
    traced = compiled(a)
    eager = matroot.inv_root_info(a, 4, **options)
    torch.testing.assert_close(traced.root, eager.root, rtol=1e-6, atol=1e-6)
    assert torch.equal(traced.iterations, eager.iterations)


def test_dynamic_shapes_batch_dimension_and_evd():
    """``dynamic=True`` passes numbers as symbolic values, which the option checks
    read with comparisons (math.isfinite cannot take one): evd compiles whole; the
    iterative methods take a dynamic batch dimension (mark_dynamic), their matrix
    size being a static decision (docs/jax.rst)."""
    torch._dynamo.reset()
    rng = np.random.default_rng(1)

    def stack(b, n):
        g = rng.standard_normal((b, n, n))
        return torch.asarray(g @ g.transpose(0, 2, 1) + n * np.eye(n), dtype=torch.float32)

    evd = torch.compile(lambda x, e: matroot.inv_root(x, 2, method="evd", eps=e),
                        dynamic=True, fullgraph=True, backend="eager")
    for a in (stack(3, 8), stack(5, 12)):
        torch.testing.assert_close(evd(a, 0.5), matroot.inv_root(a, 2, method="evd", eps=0.5))
    options = dict(method="coupled_newton", tol=0.0, max_iter=6)
    newton = torch.compile(lambda x: matroot.inv_root(x, 2, **options), fullgraph=True,
                           backend="eager")
    for b in (3, 5):
        a = stack(b, 8)
        torch._dynamo.mark_dynamic(a, 0)
        torch.testing.assert_close(newton(a), matroot.inv_root(a, 2, **options),
                                   rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the optimizer step
class _Net(torch.nn.Module):
    """A conv and two linear layers: matrix, 4-D and vector parameters."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3)
        self.fc1 = torch.nn.Linear(16, 12)
        self.fc2 = torch.nn.Linear(12, 3)


_OPTIONS = dict(lr=1e-2, block_size=8, start_preconditioning_step=1, precondition_frequency=8,
                nonfinite_grads="skip")
_REFRESH = 9      # the second root refresh; steps 2-8 have none
_NAN_STEP = 5     # a NaN gradient: the step is skipped on the device


def _gradients(model, step):
    gen = torch.Generator().manual_seed(step)
    grads = [torch.randn(p.shape, generator=gen) for p in model.parameters()]
    if step == _NAN_STEP:
        grads[2][0, 0] = float("nan")
    return grads


def _step(model, opt_step, step):
    for p, g in zip(model.parameters(), _gradients(model, step)):
        p.grad = g
    opt_step()


@pytest.fixture(scope="module")
def compiled_run():
    """A compiled optimizer beside an eager twin, step by step to the second refresh.

    Steps 1 (a refresh: outside the graph) and 2 (the first without one) warm
    up; steps 3 to 9 run with recompiles made errors. Inductor, the default
    backend, so the numbers are those of generated code.
    """
    from torch._dynamo.utils import counters

    from matroot.optim import Shampoo

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    compiled_model, eager_model = _Net(), _Net()
    eager_model.load_state_dict(compiled_model.state_dict())
    compiled_opt = Shampoo(compiled_model.parameters(), **_OPTIONS)
    eager_opt = Shampoo(eager_model.parameters(), **_OPTIONS)
    compiled_step = torch.compile(compiled_opt.step)
    gaps, graphs = [], {}
    for step in range(1, _REFRESH + 1):
        with torch._dynamo.config.patch(error_on_recompile=step > 2):
            _step(compiled_model, compiled_step, step)
        _step(eager_model, eager_opt.step, step)
        gaps.append(max(float(((a - b).abs() / b.abs().clamp_min(1e-3)).max())
                        for a, b in zip(compiled_model.parameters(), eager_model.parameters())))
        graphs[step] = counters["stats"]["unique_graphs"]
    return dict(compiled=compiled_opt, eager=eager_opt, gaps=gaps, graphs=graphs,
                breaks=sum(counters["graph_break"].values()))


def test_compiled_step_has_a_handful_of_graphs_and_no_recompiles(compiled_run):
    graphs = compiled_run["graphs"]
    # error_on_recompile held from step 3 on: reaching step 9 means none happened.
    assert graphs[_REFRESH] == graphs[2] <= 4
    # The breaks are at the host-side preparation and the refresh step's eager update.
    assert compiled_run["breaks"] <= 3


def test_compiled_step_matches_the_eager_step(compiled_run):
    assert max(compiled_run["gaps"]) < 1e-5
    compiled, eager = compiled_run["compiled"].diagnostics(), compiled_run["eager"].diagnostics()
    assert compiled == eager
    assert compiled["skipped_steps"] == 1 and compiled["root_refreshes"] == 2
    assert compiled["steps"] == _REFRESH - 1


def test_the_step_without_a_refresh_traces_as_one_graph_with_no_host_reads():
    """fullgraph=True raises at any ``.item()``, ``bool(tensor)`` or other graph break:
    the step's device side, NaN check included, reads nothing on the host."""
    from matroot.optim import Shampoo

    torch._dynamo.reset()
    model = _Net()
    opt = Shampoo(model.parameters(), **_OPTIONS)
    _step(model, opt.step, 1)
    for p, g in zip(model.parameters(), _gradients(model, _NAN_STEP)):
        p.grad = g
    jobs, grads, check_on_device = opt._prepare_step()
    assert check_on_device and not any(job.schedule[0] for job in jobs)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        torch.compile(opt._update, fullgraph=True, backend="eager")(jobs, grads,
                                                                        check_on_device)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert opt.diagnostics()["skipped_steps"] == 1


def test_finite_matrices_under_inductor_finds_nan_and_inf():
    """With torch.compile's default backend (what users run), not only ``eager``:
    inductor folds ``x·0`` to 0, so a ``sum(x·0) == 0`` finiteness test called
    every matrix finite and a NaN matrix went on as a good one."""
    from matroot import _xp

    torch._dynamo.reset()
    a = torch.ones(3, 4, 4)
    a[1, 0, 0] = float("nan")
    a[2, 3, 1] = float("inf")
    compiled = torch.compile(_xp.finite_matrices, fullgraph=True)
    assert compiled(a).tolist() == [True, False, False]
    assert _xp.finite_matrices(a).tolist() == [True, False, False]
