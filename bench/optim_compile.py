"""The torch optimizer step under ``torch.compile``: compile time and compiled / eager time.

``matroot.optim.Shampoo`` runs on the optimizer benchmark's model twice, its
``step`` wrapped in ``torch.compile`` for one and eager for the other, with the
same initial parameters and gradients. Roots are refreshed at the first step
only: a refresh step runs eagerly under ``torch.compile`` by design (the
solvers' convergence checks read the host), so the timed steps are the ones the
compiled graph covers. Gradients are checked on the device
(``nonfinite_grads="skip"``), the setting without a host read per step.

- compile time: the first compiled step without a refresh (where dynamo traces
  and the backend builds the graph) minus the eager median, with inductor's
  on-disk caches off, so it is what a first run pays (a warm cache cut it from
  minutes to 15 s on the quick model);
- ratio: the compiled median over the eager median, steps alternating between
  the two so that machine noise hits both.
"""

from __future__ import annotations

import statistics
import time

__all__ = ["compiled_step", "describe"]


def compiled_step(params0, grad_sets, *, method: str, block_size: int, steps: int,
                  device: str = "cpu", backend: str = "inductor") -> dict:
    """Time ``torch.compile(opt.step)`` against ``opt.step`` on the same model.

    Parameters
    ----------
    params0 : list of NumPy arrays
        Initial parameters (copied for each optimizer).
    grad_sets : list of lists of tensors
        Gradients, cycled through step by step.
    method : str
        ``root_method`` of both optimizers.
    block_size, steps : int
        Block size; timed steps after the compiling one.
    device : str
        torch device of the parameters.
    backend : str
        ``torch.compile`` backend ("inductor"; "eager" traces with dynamo only).

    Returns
    -------
    dict
        ``compile_s``, ``first_compiled_step_s``, ``eager_step_ms``,
        ``compiled_step_ms``, ``compiled_over_eager``, ``unique_graphs`` (dynamo's
        count) and ``max_rel_diff`` (compiled against eager parameters at the end).
    """
    import torch
    import torch._inductor.config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        return _compiled_step(torch, params0, grad_sets, method=method, block_size=block_size,
                              steps=steps, device=device, backend=backend)


def _compiled_step(torch, params0, grad_sets, *, method, block_size, steps, device, backend):
    from torch._dynamo.utils import counters

    from matroot.optim import Shampoo

    torch._dynamo.reset()
    counters.clear()
    runs = {}
    for name in ("eager", "compiled"):
        params = [torch.nn.Parameter(torch.asarray(p.copy(), device=device)) for p in params0]
        opt = Shampoo(params, lr=1e-3, block_size=block_size, distributed=None,
                      root_method=method, matrix_eps=1e-6, start_preconditioning_step=1,
                      precondition_frequency=steps + 3, nonfinite_grads="skip")
        runs[name] = (params, torch.compile(opt.step, backend=backend) if name == "compiled"
                      else opt.step)

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    def timed(name, k):
        params, step = runs[name]
        for param, grad in zip(params, grad_sets[k % len(grad_sets)]):
            param.grad = grad.clone()
        sync()
        start = time.perf_counter()
        step()
        sync()
        return time.perf_counter() - start

    for name in runs:  # step 1: the root refresh, eager in both
        timed(name, 0)
    timed("eager", 1)
    first_compiled = timed("compiled", 1)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for k in range(2, steps + 2):
        for name in (("eager", "compiled") if k % 2 == 0 else ("compiled", "eager")):
            times[name].append(timed(name, k))
    eager, compiled = (statistics.median(times[name]) for name in ("eager", "compiled"))
    gap = max(float(((a - b).abs() / b.abs().clamp_min(1e-3)).max())
              for a, b in zip(runs["compiled"][0], runs["eager"][0]))
    return dict(backend=backend, compile_s=first_compiled - eager,
                first_compiled_step_s=first_compiled, eager_step_ms=1e3 * eager,
                compiled_step_ms=1e3 * compiled, compiled_over_eager=compiled / eager,
                unique_graphs=int(counters["stats"]["unique_graphs"]), max_rel_diff=gap)


def describe(result: dict) -> str:
    """One line for the benchmark's table."""
    return (f"torch.compile({result['backend']}) of Shampoo.step, steps without a root "
            f"refresh: compile {result['compile_s']:.1f} s; {result['compiled_step_ms']:.1f} ms "
            f"compiled vs {result['eager_step_ms']:.1f} ms eager per step: "
            f"{result['compiled_over_eager']:.2f}x ({result['unique_graphs']} graphs, "
            f"parameters within {result['max_rel_diff']:.0e} of eager)")
