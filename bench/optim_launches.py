"""Operations and host syncs per optimizer step, counted through torch's dispatcher.

The model of issue 35: 16 × ``Linear(256, 256)``, 4 × ``Linear(512, 256)``, two odd
shapes and a convolution (:func:`launch_model`), every parameter with a gradient
at every step. Shampoo runs with ``block_size=256``, ``root_method="coupled_newton"``
and a refresh every third step; AdamW with ``foreach=True`` is the yardstick. Each
step is counted with :class:`matroot.testing.launch_count.LaunchCount` (on a GPU every
counted operation is about one kernel launch, every sync a drained stream); the
counts are the same on every run, so tests assert them and the table records them.
"""

from __future__ import annotations

__all__ = ["launch_model", "count_steps", "shampoo_options", "step_rows"]

#: The Shampoo settings of the counted step.
SHAMPOO = dict(lr=1e-3, block_size=256, root_method="coupled_newton",
               precondition_frequency=3, distributed=None)


def shampoo_options(**overrides) -> dict:
    """:data:`SHAMPOO` with ``overrides``."""
    return {**SHAMPOO, **overrides}


def launch_model(extra_layers: int = 0, seed: int = 0):
    """Issue 35's model, with ``extra_layers`` more ``Linear(256, 256)``."""
    import torch

    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(256, 256)
                                     for _ in range(16 + extra_layers)]
    layers += [torch.nn.Linear(512, 256) for _ in range(4)]
    layers += [torch.nn.Linear(100, 37), torch.nn.Linear(37, 10), torch.nn.Conv2d(3, 16, 3)]
    return torch.nn.ModuleList(layers)


def count_steps(make_optimizer, model, steps: int, seed: int = 1) -> list[tuple[int, int]]:
    """``(ops, syncs)`` of each of ``steps`` optimizer steps on fresh random gradients.

    ``make_optimizer(params)`` builds the optimizer; gradient ``k`` of the run is the
    same whatever the optimizer.
    """
    import torch

    from matroot.testing.launch_count import LaunchCount

    opt = make_optimizer(list(model.parameters()))
    generator = torch.Generator().manual_seed(seed)
    counts = []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = 0.01 * torch.randn(p.shape, generator=generator, dtype=p.dtype)
        with LaunchCount() as count:
            opt.step()
        counts.append((count.ops, count.syncs))
    return counts


def step_rows(extra_layers: int = 16) -> list[dict]:
    """The table's rows: AdamW(foreach) and Shampoo per step, between refreshes and at
    a refresh, on the model and on it with ``extra_layers`` more layers, for both
    non-finite policies."""
    import torch

    from matroot.optim import Shampoo

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-3, foreach=True)

    rows = []
    for extra in (0, extra_layers):
        counts = count_steps(adamw, launch_model(extra), 3)
        rows.append({"optimizer": "AdamW(foreach=True)", "layers": 23 + extra,
                     "between": counts[-1], "refresh": counts[-1]})
        for policy in ("raise", "skip"):
            def shampoo(params, policy=policy):
                return Shampoo(params, **shampoo_options(nonfinite_grads=policy))
            counts = count_steps(shampoo, launch_model(extra), 4)
            # Step 3 refreshes; step 4 is a step between refreshes (its state made).
            rows.append({"optimizer": f"matroot Shampoo ({policy})", "layers": 23 + extra,
                         "between": counts[3], "refresh": counts[2]})
    return rows
