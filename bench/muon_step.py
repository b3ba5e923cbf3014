"""One Muon step on a model with many same-shape layers: time and dispatched operations,
matroot's stacked Muon against torch.optim.Muon + torch.optim.AdamW, side by side.

The model: 16 ``Linear(256, 256)`` and 4 ``Linear(512, 256)``; the weights take Muon,
the biases AdamW, both with torch's default weight decays (0.1 and 0.01). Each
repeat times every contender once, in turn, so that the machine's load falls on all
alike; reported are the medians and their ratios. Operations are counted with issue
35's definition (``matroot.testing.launch_count``). torch.optim.Muon runs twice: as it is
(bfloat16 iterates, which this CPU computes slowly) and with float32 iterates
(``tests/torch_muon_reference.py``), the fair comparison on a CPU.

Not installed and not a test::

    python -m bench muon_step --threads 1 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from matroot.testing.launch_count import LaunchCount as Count  # noqa: E402
from torch_muon_reference import newton_schulz_float32  # noqa: E402

import matroot  # noqa: E402
from matroot.optim import Muon  # noqa: E402


def make(kind: str):
    torch.manual_seed(0)
    layers = ([torch.nn.Linear(256, 256) for _ in range(16)]
              + [torch.nn.Linear(512, 256) for _ in range(4)])
    hidden, others = [m.weight for m in layers], [m.bias for m in layers]
    if kind == "matroot":
        opts = [Muon([{"params": hidden, "use_muon": True},
                      {"params": others, "use_muon": False}],
                     weight_decay=0.1, adamw_weight_decay=0.01)]
    elif kind == "adamw":
        opts = [torch.optim.AdamW(hidden + others)]
    else:
        opts = [torch.optim.Muon(hidden), torch.optim.AdamW(others)]
    return hidden + others, opts


def step(kind: str, params, opts) -> tuple[float, int]:
    import torch.optim._muon as torch_muon
    original = torch_muon._zeropower_via_newtonschulz
    if kind == "torch, float32 iterates":
        torch_muon._zeropower_via_newtonschulz = newton_schulz_float32
    try:
        for p in params:
            p.grad = torch.randn_like(p)
        start = time.perf_counter()
        with Count() as count:
            for opt in opts:
                opt.step()
        return time.perf_counter() - start, count.ops
    finally:
        torch_muon._zeropower_via_newtonschulz = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--bfloat16-repeats", type=int, default=1,
                        help="repeats of torch.optim.Muon as it is (slow on CPUs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kinds = ["matroot", "torch, float32 iterates", "torch, as is", "adamw"]
    setups = {k: make(k) for k in kinds}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    ops = {}
    for k in kinds:             # warm-up: state made, schedules cached
        step(k, *setups[k])
    for r in range(args.repeats):
        for k in kinds:
            if k == "torch, as is" and r >= args.bfloat16_repeats:
                continue
            seconds, ops[k] = step(k, *setups[k])
            times[k].append(seconds)
    median = {k: statistics.median(v) for k, v in times.items()}
    tuned = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print(f"torch {torch.__version__}, {args.threads} thread(s), matroot {matroot.__version__}, "
          f"malloc: {tuned or 'glibc defaults'}")
    print("| optimizer | step ms (median) | dispatched operations | matroot's time / this "
          "| matroot's operations / this |\n|---|---|---|---|---|")
    for k in kinds:
        print(f"| {k} | {1e3 * median[k]:.1f} | {ops[k]} | "
              f"{median['matroot'] / median[k]:.2f} | {ops['matroot'] / ops[k]:.2f} |")


if __name__ == "__main__":
    main()
