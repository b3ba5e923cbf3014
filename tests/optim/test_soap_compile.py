"""``matroot.optim.SOAP`` under ``torch.compile``: the compiled step equals the eager one,
and the device side of a step between refreshes traces as one graph (``fullgraph=True``).

``opt.step`` itself is not one graph: it reads the host once per step (the non-finite
screen) and a refresh step runs its eigenbasis refresh eagerly (its certificate reads
the host). ``backend="eager"`` checks Dynamo's tracing, which is what ``fullgraph``
concerns, without a C++ compile.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from matroot.optim import SOAP  # noqa: E402
from matroot.optim.soap import all_finite, copy_state, update  # noqa: E402

OPTIONS = dict(lr=0.01, precondition_frequency=4, block_size=4)
STEPS = 9          # refreshes at steps 1, 5 and 9


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 4))


def _backward(model, step):
    gen = torch.Generator().manual_seed(step)
    x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()


def test_compiled_step_matches_the_eager_step():
    torch._dynamo.reset()
    compiled_model, eager_model = _net(), _net()
    compiled = SOAP(compiled_model.parameters(), **OPTIONS)
    eager = SOAP(eager_model.parameters(), **OPTIONS)
    step = torch.compile(compiled.step, backend="eager")
    gaps = []
    for k in range(STEPS):
        _backward(compiled_model, k)
        step()
        _backward(eager_model, k)
        eager.step()
        gaps.append(max(float((a - b).abs().max()) for a, b in
                        zip(compiled_model.parameters(), eager_model.parameters())))
    assert max(gaps) <= 1e-6, gaps        # measured 0.0
    assert compiled.diagnostics() == eager.diagnostics()
    assert compiled.diagnostics()["refreshes"] == 3


def test_the_device_side_between_refreshes_is_one_graph():
    """``fullgraph=True`` raises at any ``.item()`` or other graph break: a step between
    refreshes with the finiteness flag on the device reads nothing on the host, and
    gives the eager step's update and state."""
    torch._dynamo.reset()
    model = _net()
    opt = SOAP(model.parameters(), **OPTIONS)
    for k in range(2):                    # a refresh at step 1, then a plain step
        _backward(model, k)
        opt.step()
    _backward(model, 2)
    family = opt._families[0]
    params = [p.detach() for p in family.params]
    grads = [p.grad for p in family.params]

    def device_step(grads, state):
        return update(grads, state, params, family.config, check_grads=False,
                      finite=all_finite(grads), refresh=False, in_place=True)

    eager_updates, eager_state = device_step(grads, copy_state(family.state))
    updates, state = torch.compile(device_step, fullgraph=True, backend="eager")(
        grads, copy_state(family.state))
    for a, b in zip(updates, eager_updates):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(state.block_exp_avg_sq, eager_state.block_exp_avg_sq):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    assert int(state.step) == int(eager_state.step) == 3


def test_a_step_compiled_by_inductor_runs_past_the_first_step():
    """As torch users compile an optimizer step: ``torch.compile`` of a function calling
    ``opt.step()``, the default backend. The step counts once reached Inductor as Python
    ints that Dynamo made symbols at the second step, and its foreach kernel of the bias
    corrections named a symbol it never defined (``NameError: name 's1' is not
    defined``); they reach the core as 0-d tensors now."""
    torch._dynamo.reset()
    compiled_model, eager_model = _net(), _net()
    compiled = SOAP(compiled_model.parameters(), **OPTIONS)
    eager = SOAP(eager_model.parameters(), **OPTIONS)

    @torch.compile
    def step():
        compiled.step()

    for k in range(3):
        _backward(compiled_model, k)
        step()
        _backward(eager_model, k)
        eager.step()
    for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)   # Inductor fuses: 1.5e-8
    assert compiled.state_dict()["soap_families"][0]["param_steps"] == [3, 3, 3, 3]
