"""Small torch problems the Shampoo option tests train on (a linear least-squares fit)
and the optimizer runs several of their files share."""

import torch

from matroot.optim import Shampoo


def linear_problem(seed, rows=24, cols=6, batch=32):
    """Inputs, targets, and a weight and bias to fit them (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, cols, generator=g), torch.randn(batch, rows, generator=g),
            torch.nn.Parameter(torch.randn(rows, cols, generator=g) / 3),
            torch.nn.Parameter(torch.randn(rows, generator=g) / 3))


def run_steps(params, opt, x, y, steps):
    """``steps`` optimizer steps of the least-squares fit of ``x`` to ``y``."""
    w, b = params
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(x @ w.T + b, y).backward()
        opt.step()


def stored_run(dtype, steps=8):
    """Shampoo storing its roots as ``dtype``, after ``steps`` steps on a 40 × 12 fit."""
    x, y, w, b = linear_problem(8, rows=40, cols=12)
    opt = Shampoo([w, b], lr=1e-2, block_size=32, precondition_frequency=2,
                  root_storage_dtype=dtype, symmetric_packing=False)
    run_steps((w, b), opt, x, y, steps)
    return opt, (w, b), (x, y)


def every_step_run(keep_roots, steps, **options):
    """Shampoo refreshing every root at every step (``keep_roots`` as given), after
    ``steps`` steps on a 40 × 12 fit."""
    x, y, w, b = linear_problem(9, rows=40, cols=12)
    opt = Shampoo([w, b], lr=1e-2, block_size=32, precondition_frequency=1,
                  precondition_1d=True, keep_roots=keep_roots, **options)
    run_steps((w, b), opt, x, y, steps)
    return opt, (w, b), (x, y)
