"""``lr`` by position, as torch's optimizers (and Distributed Shampoo) take it:
``Shampoo(model.parameters(), 1e-3)`` and ``SOAP(...)`` were TypeErrors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from matroot.optim import SOAP, Shampoo  # noqa: E402

OPTIMIZERS = [Shampoo, SOAP]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.__name__)
def test_lr_by_position_is_lr_by_keyword(optimizer):
    models = [torch.nn.Linear(6, 4) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [optimizer(models[0].parameters(), 0.05), optimizer(models[1].parameters(), lr=0.05)]
    assert [o.param_groups[0]["lr"] for o in opts] == [0.05, 0.05]
    x = torch.randn(16, 6)
    for model, opt in zip(models, opts):
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters()))


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.__name__)
def test_an_invalid_positional_lr_is_refused_as_the_keyword_is(optimizer):
    with pytest.raises(ValueError, match="lr"):
        optimizer(torch.nn.Linear(2, 2).parameters(), -1.0)
