"""Train a small CNN on scikit-learn's bundled digits with AdamW and with matroot Shampoo.

The 1797 8×8 handwritten digits ship inside scikit-learn (no download). The
model (two 3×3 convolutions, a 2048→128 and a 128→10 linear layer; 282k
parameters) is trained with minibatches of 128 for ``--steps`` steps by AdamW
and by Shampoo with several inverse-root methods. Every optimizer gets its
learning rate from the same grid: every rate runs on every seed and the one
with the lowest mean final training loss is kept; its curves, averaged over the
seeds, are what is reported.

Writes ``digits_loss.png`` (training loss and test accuracy against steps) and
``digits_summary.json`` to ``--out`` (default: examples/results).

Run::

    python examples/train_digits.py --threads 1   # about 3 minutes on one core
    python examples/train_digits.py --quick    # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

import numpy as np
import torch
from sklearn.datasets import load_digits

import matroot
from matroot.optim import Shampoo

OPTIMIZERS = {
    "AdamW": None,
    "Shampoo (evd)": dict(root_method="evd"),
    "Shampoo (newton_db)": dict(root_method="newton_db"),
    "Shampoo (coupled_newton)": dict(root_method="coupled_newton"),
}
SHAMPOO = dict(block_size=128, precondition_frequency=10, start_preconditioning_step=10,
               matrix_eps=1e-6)
COMMON = dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)


def load_data(seed: int = 0):
    """Digits as (N, 1, 8, 8) float tensors in [0, 1], split 1400 train / 397 test."""
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32)[:, None]
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    train, test = order[:1400], order[1400:]
    return (x[train], y[train]), (x[test], y[test])


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))


def make_optimizer(name, params, lr):
    if OPTIMIZERS[name] is None:
        return torch.optim.AdamW(params, lr=lr, **COMMON)
    return Shampoo(params, lr=lr, **COMMON, **SHAMPOO, **OPTIMIZERS[name])


@torch.no_grad()
def evaluate(model, data):
    x, y = data
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    return float(loss), float((logits.argmax(1) == y).float().mean())


def train(name, lr, steps, seed, train_data, test_data, eval_every, batch=128):
    """One run; returns the evaluated curves and the optimizer's counters."""
    model = make_model(seed)
    opt = make_optimizer(name, model.parameters(), lr)
    x, y = train_data
    g = torch.Generator().manual_seed(1000 + seed)
    order = torch.randperm(len(y), generator=g)
    cursor = 0
    curve = {"step": [], "train_loss": [], "test_loss": [], "test_accuracy": []}
    step_time = 0.0
    for step in range(1, steps + 1):
        if cursor + batch > len(y):
            order, cursor = torch.randperm(len(y), generator=g), 0
        index = order[cursor:cursor + batch]
        cursor += batch
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[index]), y[index]).backward()
        start = time.perf_counter()
        opt.step()
        step_time += time.perf_counter() - start
        if step % eval_every == 0 or step == steps:
            train_loss, _ = evaluate(model, train_data)
            test_loss, test_acc = evaluate(model, test_data)
            curve["step"].append(step)
            curve["train_loss"].append(train_loss)
            curve["test_loss"].append(test_loss)
            curve["test_accuracy"].append(test_acc)
    info = opt.diagnostics() if isinstance(opt, Shampoo) else {}
    return curve, step_time / steps, info


def steps_to_reach(steps, losses, target):
    """First evaluated step whose loss is at most ``target`` (None if never)."""
    for step, loss in zip(steps, losses):
        if loss <= target:
            return step
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-3, 1e-2, 3e-2])
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).parent / "results")
    parser.add_argument("--quick", action="store_true",
                        help="30 steps, one seed, one learning rate (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.lrs, args.eval_every = 30, 1, [1e-2], 10
    if args.threads:
        torch.set_num_threads(args.threads)
    train_data, test_data = load_data()
    began = time.perf_counter()

    # Every learning rate of the grid on every seed; each optimizer keeps the rate
    # whose mean final training loss over the seeds is lowest.
    results = {}
    for name in OPTIMIZERS:
        runs = {lr: [train(name, lr, args.steps, seed, train_data, test_data, args.eval_every)
                     for seed in range(args.seeds)] for lr in args.lrs}
        tuning = {lr: float(np.mean([c["train_loss"][-1] for c, _, _ in done]))
                  for lr, done in runs.items()}
        for lr, loss in tuning.items():
            print(f"tune {name:26s} lr={lr:g}: mean final train loss {loss:.4f}", flush=True)
        lr = min(tuning, key=tuning.get)
        curves, times, infos = zip(*runs[lr])
        mean = {key: np.mean([c[key] for c in curves], axis=0).tolist()
                for key in ("train_loss", "test_loss", "test_accuracy")}
        results[name] = dict(lr=lr, step=curves[0]["step"], **mean,
                             step_time_ms=1e3 * float(np.mean(times)),
                             tuning={str(k): v for k, v in tuning.items()})
        if infos[0]:
            results[name].update(
                root_refreshes=infos[0]["root_refreshes"],
                root_failures=int(sum(i["root_failures"] for i in infos)),
                stacks=infos[0]["stacks"], blocks=infos[0]["blocks"],
                state_bytes_per_parameter=infos[0]["state_bytes_per_parameter"])
        print(f"{name:26s} lr={lr:g} final train loss {mean['train_loss'][-1]:.4f} "
              f"test acc {mean['test_accuracy'][-1]:.4f}", flush=True)

    adam = results["AdamW"]
    target = adam["train_loss"][-1]
    for r in results.values():
        r["final_train_loss"] = r["train_loss"][-1]
        r["final_test_loss"] = r["test_loss"][-1]
        r["final_test_accuracy"] = r["test_accuracy"][-1]
        r["steps_to_adamw_final_train_loss"] = steps_to_reach(r["step"], r["train_loss"], target)
        r["train_loss_ratio_to_adamw"] = r["train_loss"][-1] / target

    args.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "task": "sklearn digits, CNN conv16-conv32-fc128-fc10, batch 128, train 1400 / test 397",
        "parameters": sum(p.numel() for p in make_model(0).parameters()),
        "steps": args.steps, "seeds": args.seeds, "lr_grid": args.lrs,
        "step_time_note": "optimizer.step() only, mean over the run; machine shared, noisy",
        "common": {k: list(v) if isinstance(v, tuple) else v for k, v in COMMON.items()},
        "shampoo": SHAMPOO,
        "adamw_final_train_loss": target,
        "wall_seconds": time.perf_counter() - began,
        "machine": f"{platform.machine()}, torch {torch.__version__}, "
                   f"{torch.get_num_threads()} threads, matroot {matroot.__version__}",
        "results": results,
    }
    (args.out / "digits_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(results, args.out / "digits_loss.png", args.steps)
    for name, r in results.items():
        reach = r["steps_to_adamw_final_train_loss"]
        print(f"{name:26s} reaches AdamW's final train loss {target:.4f} at step "
              f"{reach if reach is not None else 'never'}; final {r['final_train_loss']:.4f}")
    print(f"wrote {args.out / 'digits_summary.json'} and {args.out / 'digits_loss.png'} "
          f"in {summary['wall_seconds']:.0f} s")
    return 0


def plot(results, path, steps):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, r in results.items():
        ax_loss.plot(r["step"], r["train_loss"], label=f"{name}, lr={r['lr']:g}")
        ax_acc.plot(r["step"], r["test_accuracy"], label=name)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (full training set)")
    ax_loss.set_title("digits CNN: training loss")
    ax_loss.legend(fontsize=8)
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("test accuracy")
    ax_acc.set_ylim(0.8, 1.0)
    ax_acc.set_title("test accuracy")
    ax_acc.set_xlim(0, steps)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
