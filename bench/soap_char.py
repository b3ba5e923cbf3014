"""SOAP against AdamW and Distributed Shampoo's SOAP on the character-level MLP (issue 38).

The task is issue 37's (bench/muon_char.py: 16 characters of the standard library's
source, embedding 32, hidden layers of 256, 300 steps of 128 windows, the held-out loss
of 4096 windows). Every parameter takes the optimizer under test; no weight decay. The
contenders, each at two learning rates:

- ``matroot``: ``matroot.optim.SOAP`` with its defaults (betas (0.95, 0.95), eps 1e-8,
  refresh every 10 steps from step 1, block size 1024);
- ``ds``: Distributed Shampoo with ``DefaultSOAPConfig`` and the same betas, eps,
  frequency and block size (its first refresh is at step 10: it requires
  ``start_preconditioning_step >= precondition_frequency``); run when
  ``distributed_shampoo`` imports (``PYTHONPATH=/tmp/optimizers``), never a test
  dependency;
- ``adamw``: ``torch.optim.AdamW``.

``--timing`` measures the optimizer step alone on a model of 16 ``Linear(256, 256)``
layers (16 same-size blocks on each side), matroot's and DS's SOAP with equal settings,
20 steps a round (two refreshes), in alternating rounds; the median ratio is reported.
Results: ``bench/results/soap.json`` (runs and timing) and ``soap.md`` (the table).

    PYTHONPATH=/tmp/optimizers python -m bench soap_char --threads 1
    python -m bench soap_char --quick
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from muon_char import CharMLP, Data, evaluate

COMMON = dict(betas=(0.95, 0.95), eps=1e-8, weight_decay=0.0, precondition_frequency=10,
              block_size=1024)
CONTENDERS = {"matroot": (3e-3, 1e-2), "ds": (3e-3, 1e-2), "adamw": (3e-3, 1e-2)}


def has_ds() -> bool:
    try:
        import distributed_shampoo  # noqa: F401
    except ImportError:
        return False
    return True


def make_optimizer(kind: str, params, lr: float):
    params = list(params)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if kind == "matroot":
        from matroot.optim import SOAP
        return SOAP(params, lr=lr, **COMMON)
    from distributed_shampoo import DefaultSOAPConfig, DistributedShampoo
    return DistributedShampoo(
        params, lr=lr, betas=COMMON["betas"], epsilon=COMMON["eps"],
        weight_decay=COMMON["weight_decay"],
        precondition_frequency=COMMON["precondition_frequency"],
        max_preconditioner_dim=COMMON["block_size"], use_bias_correction=True,
        preconditioner_config=DefaultSOAPConfig)


def train(kind: str, data: Data, *, lr: float, steps: int, seed: int,
          eval_every: int = 25) -> dict:
    torch.manual_seed(seed)
    model = CharMLP(data.vocab)
    opt = make_optimizer(kind, model.parameters(), lr)
    gen = np.random.default_rng(seed)
    curve, step_time = [(0, evaluate(model, data))], 0.0
    for step in range(1, steps + 1):
        x, y = data.batch(gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        start = time.perf_counter()
        opt.step()
        step_time += time.perf_counter() - start
        if step % eval_every == 0 or step == steps:
            curve.append((step, evaluate(model, data)))
    return {"kind": kind, "lr": lr, "seed": seed, "curve": curve, "final": curve[-1][1],
            "step_ms": 1e3 * step_time / steps}


def timing(rounds: int, steps: int = 20, layers: int = 16, width: int = 256) -> dict:
    """Median over alternating rounds of each SOAP's mean step time (ms), and the
    medians of its steps without and with a refresh (matroot refreshes at steps 1, 11,
    21, ...; DS at 10, 20, ...)."""
    torch.manual_seed(0)
    models = {k: torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
              for k in ("matroot", "ds")}
    models["ds"].load_state_dict(models["matroot"].state_dict())
    opts = {k: make_optimizer(k, m.parameters(), 1e-3) for k, m in models.items()}
    x = torch.randn(64, width)
    times: dict = {"matroot": [], "ds": []}
    each: dict = {"matroot": ([], []), "ds": ([], [])}
    count = {"matroot": 0, "ds": 0}
    for r in range(rounds + 1):           # the first round warms up, not counted
        for kind in ("matroot", "ds"):
            elapsed = 0.0
            for _ in range(steps):
                opts[kind].zero_grad(set_to_none=True)
                models[kind](x).square().mean().backward()
                start = time.perf_counter()
                opts[kind].step()
                took = time.perf_counter() - start
                elapsed += took
                count[kind] += 1
                t = count[kind]
                refresh = (t - 1) % 10 == 0 if kind == "matroot" else t % 10 == 0
                if r:
                    each[kind][refresh].append(1e3 * took)
            times[kind].append(1e3 * elapsed / steps)
    ratios = [a / b for a, b in zip(times["matroot"][1:], times["ds"][1:])]
    return {"layers": layers, "width": width, "steps_per_round": steps, "rounds": rounds,
            "matroot_ms": times["matroot"][1:], "ds_ms": times["ds"][1:],
            "median_ratio": statistics.median(ratios),
            "plain_step_ms": {k: statistics.median(v[0]) for k, v in each.items()},
            "refresh_step_ms": {k: statistics.median(v[1]) for k, v in each.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--timing", type=int, default=0, metavar="ROUNDS")
    parser.add_argument("--only", nargs="*", default=list(CONTENDERS))
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.timing:
        result = timing(args.timing)
        print(json.dumps(result, indent=1))
        save(args, "step", result)
        return
    data = Data(args.quick)
    steps = 20 if args.quick else args.steps
    runs = []
    kinds = [k for k in args.only if k != "ds" or has_ds()]
    for kind in kinds:
        for lr in CONTENDERS[kind]:
            for seed in range(args.seeds):
                run = train(kind, data, lr=lr, steps=steps, seed=seed)
                runs.append(run)
                print(f"{kind:8s} lr={lr:<6g} seed={seed} final={run['final']:.4f} "
                      f"step={run['step_ms']:.2f} ms", flush=True)
    if args.quick:
        return
    save(args, "char", runs)
    write_table(runs, args)


def save(args, key: str, value) -> None:
    """``bench/results/soap.json``: the char runs under "char", the timing under "step"."""
    path = args.out / "soap.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved[key] = value
    path.write_text(json.dumps(saved, indent=1))


def write_table(runs: list[dict], args) -> None:
    adamw = np.mean([r["step_ms"] for r in runs if r["kind"] == "adamw"] or [np.nan])
    rows = []
    for kind, lrs in CONTENDERS.items():
        for lr in lrs:
            mine = [r for r in runs if r["kind"] == kind and r["lr"] == lr]
            if not mine:
                continue
            finals = np.array([r["final"] for r in mine])
            step_ms = float(np.mean([r["step_ms"] for r in mine]))
            rows.append(f"| {kind} | {lr:g} | {finals.mean():.4f} | {finals.min():.4f}–"
                        f"{finals.max():.4f} | {step_ms:.2f} | {step_ms / adamw:.2f} |")
    header = ("| optimizer | lr | final eval loss (mean) | range over seeds | step ms | "
              "step / AdamW's |\n|---|---|---|---|---|---|\n")
    (args.out / "soap.md").write_text(
        header + "\n".join(rows) + f"\n\n- {args.seeds} seeds, {args.steps} steps, torch "
        f"{torch.__version__}, {args.threads} thread(s), no weight decay; step times on a "
        "shared 2-core machine: only the ratios mean something\n")


if __name__ == "__main__":
    main()
