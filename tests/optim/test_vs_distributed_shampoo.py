"""matroot's Shampoo against Meta's Distributed Shampoo, option by option of the
migration table in docs/optimizer.rst.

Distributed Shampoo is not on PyPI, so this module runs only where it is importable
(``PYTHONPATH=/path/to/facebookresearch/optimizers``; see bench/optim_memory.py).
Both optimizers take the same float64 gradients for 20 steps with eigendecomposition
roots refreshed every step; matrix parameters must end where Meta's do up to the one
documented difference (Meta bias-corrects its factors, which grafting cancels except
against ``matrix_eps`` = 1e-12), while they move by 0.05 to 0.25.
"""

import pytest

torch = pytest.importorskip("torch")
ds = pytest.importorskip("distributed_shampoo")

from matroot.optim import Shampoo  # noqa: E402

#: Matrix parameters only: Meta's exponent-0 vectors follow another rule (the table says).
SHAPES = [(24, 16), (10, 24), (40, 16)]
STEPS = 20
SHARED_META = dict(lr=1e-2, epsilon=1e-12, weight_decay=1e-3, max_preconditioner_dim=16,
                   precondition_frequency=1, start_preconditioning_step=3)
SHARED_MATROOT = dict(lr=1e-2, matrix_eps=1e-12, weight_decay=1e-3, block_size=16,
                      precondition_frequency=1, start_preconditioning_step=3,
                      root_method="evd", distributed=None)


def _recipes():
    from distributed_shampoo.shampoo_types import ClassicMomentumConfig

    return {
        "adam, l2": (
            dict(betas=(0.9, 0.999), weight_decay_type=ds.WeightDecayType.L2,
                 grafting_config=ds.AdamPreconditionerConfig(beta2=0.999, epsilon=1e-8)),
            dict(betas=(0.9, 0.999), weight_decay_type="l2", grafting="adam",
                 grafting_beta2=0.999, eps=1e-8)),
        "adam, decoupled": (
            dict(betas=(0.9, 0.999), weight_decay_type=ds.WeightDecayType.DECOUPLED,
                 grafting_config=ds.AdamPreconditionerConfig(beta2=0.999, epsilon=1e-8)),
            dict(betas=(0.9, 0.999), grafting="adam", grafting_beta2=0.999, eps=1e-8)),
        # INDEPENDENT decays by lr·λ/peak_lr: decoupled decay with λ/peak_lr (lr 1e-2).
        "adam, independent": (
            dict(betas=(0.9, 0.999), weight_decay_type=ds.WeightDecayType.INDEPENDENT,
                 grafting_config=ds.AdamPreconditionerConfig(beta2=0.999, epsilon=1e-8)),
            dict(betas=(0.9, 0.999), weight_decay=1e-3 / 1e-2, grafting="adam",
                 grafting_beta2=0.999, eps=1e-8)),
        "sgd, momentum": (
            dict(betas=(0.0, 0.999), weight_decay=0.0,
                 grafting_config=ds.SGDPreconditionerConfig(),
                 iterate_averaging_config=ClassicMomentumConfig(momentum=0.9)),
            dict(betas=(0.0, 0.999), weight_decay=0.0, grafting="sgd", momentum=0.9)),
        "adagrad": (
            dict(betas=(0.9, 1.0), grafting_config=ds.AdaGradPreconditionerConfig(epsilon=1e-10)),
            dict(betas=(0.9, 1.0), grafting="adagrad", eps=1e-10)),
        "rmsprop": (
            dict(betas=(0.9, 0.99),
                 grafting_config=ds.RMSpropPreconditionerConfig(beta2=0.99, epsilon=1e-8)),
            dict(betas=(0.9, 0.99), grafting="rmsprop", grafting_beta2=0.99, eps=1e-8)),
    }


def _train(make):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64))
              for s in SHAPES]
    start = [p.detach().clone() for p in params]
    opt = make(params)
    for step in range(STEPS):
        noise = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = 0.1 * torch.randn(p.shape, generator=noise, dtype=torch.float64) \
                + 0.05 * p.detach()
        opt.step()
    return start, [p.detach() for p in params]


@pytest.mark.parametrize("recipe", ["adam, l2", "adam, decoupled", "adam, independent",
                                    "sgd, momentum", "adagrad", "rmsprop"])
def test_translated_configs_follow_distributed_shampoos_trajectory(recipe):
    meta_options, matroot_options = _recipes()[recipe]
    start, theirs = _train(lambda ps: ds.DistributedShampoo(ps, **{**SHARED_META,
                                                                   **meta_options}))
    _, ours = _train(lambda ps: Shampoo(ps, **{**SHARED_MATROOT, **matroot_options}))
    for s, a, b in zip(start, theirs, ours):
        assert (a - s).abs().max() > 0.05, "the run must move the parameters"
        assert (a - b).abs().max() < 1e-5
