"""Shampoo's grafting and update options (SGD/RMSprop/Adagrad/Adam grafting, L2 and
decoupled weight decay, momentum, maximize) against their elementwise definitions and
torch's own optimizers."""


import numpy as np
import pytest

torch = pytest.importorskip("torch")

from matroot.optim import Shampoo, ShampooConfig, init, update  # noqa: E402


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
