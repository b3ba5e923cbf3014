"""Stacked Muon (``matroot.optim.Muon``) against AdamW on two small tasks, seeded.

- **digits**: the CNN of ``train_digits.py`` on scikit-learn's bundled digits
  (batches of 128); the loss is the full training set's, as in that example.
- **char**: a character-level transformer (2 pre-norm layers, width 64, 4 heads,
  context 64, batches of 32) on the dataset descriptions that ship with
  scikit-learn (``sklearn/datasets/descr/*.rst``, 43 kB of English with reST
  markup; fixed by the pinned scikit-learn, no download); the loss is that of 64
  fixed windows of the last tenth of the text, which training never sees.

AdamW's learning rate is tuned first (every rate of its grid on every seed; the
lowest mean final loss wins). Muon then takes AdamW's rate for its AdamW part
(embeddings, the output layer, biases and norms) and tunes its own rate the same
way; the output layer goes to AdamW by name (``head``) or, for the digits CNN,
by an explicit group. Reported: each optimizer's mean curve over the seeds, and
the first evaluated step at which Muon's mean loss is at most AdamW's final one.
Muon runs with its default polar factor (Polar Express, 4 steps) and, at the
same rate, with the classical 5-step quintic.

Writes ``muon_vs_adamw.json`` and ``muon_vs_adamw.md`` to ``--out`` (default:
examples/results).

Run::

    python examples/muon_vs_adamw.py --threads 1   # 7.5 minutes on one busy core
    python examples/muon_vs_adamw.py --quick       # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import sklearn
import torch

import matroot
from matroot.optim import Muon
from train_digits import load_data, make_model, steps_to_reach


@dataclass(frozen=True)
class Task:
    """One training problem: a model factory, a batch sampler and an evaluation."""

    name: str
    description: str
    make_model: Callable[[int], torch.nn.Module]
    batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[torch.nn.Module], float]
    muon_groups: Callable[[torch.nn.Module], list]
    steps: int
    eval_every: int
    adamw_lrs: tuple[float, ...]
    muon_lrs: tuple[float, ...]


def _cross_entropy(model, x, y):
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             y.reshape(-1))


def digits_task() -> Task:
    (x, y), _ = load_data()

    def batch(gen):
        index = torch.randint(0, len(y), (128,), generator=gen)
        return x[index], y[index]

    @torch.no_grad()
    def evaluate(model):
        return float(_cross_entropy(model, x, y))

    def muon_groups(model):
        *body, head_weight, head_bias = model.parameters()
        matrices = [p for p in body if p.ndim >= 2]
        rest = [p for p in body if p.ndim < 2] + [head_weight, head_bias]
        return [{"params": matrices, "use_muon": True},
                {"params": rest, "use_muon": False}]

    return Task("digits", "sklearn digits, CNN conv16-conv32-fc128-fc10 (282k parameters), "
                "batch 128, full training-set loss", make_model, batch, _cross_entropy,
                evaluate, muon_groups, steps=120, eval_every=10,
                adamw_lrs=(3e-3, 1e-2, 3e-2), muon_lrs=(0.005, 0.01, 0.02, 0.05))


class CharTransformer(torch.nn.Module):
    """A causal character-level transformer; embeddings and ``head`` take AdamW."""

    def __init__(self, vocabulary: int, width: int = 64, layers: int = 2, heads: int = 4,
                 context: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocabulary, width)
        self.embed_position = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                             batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocabulary)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embed(tokens) + self.embed_position(torch.arange(length))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def char_task(context: int = 64) -> Task:
    folder = pathlib.Path(sklearn.__file__).parent / "datasets" / "descr"
    text = "".join(path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.rst")))
    alphabet = sorted(set(text))
    codes = torch.tensor([alphabet.index(c) for c in text], dtype=torch.long)
    split = int(0.9 * len(codes))
    train, held_out = codes[:split], codes[split:]
    starts = torch.linspace(0, len(held_out) - context - 2, 64).long()
    eval_x = torch.stack([held_out[s:s + context] for s in starts])
    eval_y = torch.stack([held_out[s + 1:s + context + 1] for s in starts])

    def batch(gen):
        starts = torch.randint(0, len(train) - context - 1, (32,), generator=gen)
        x = torch.stack([train[s:s + context] for s in starts])
        y = torch.stack([train[s + 1:s + context + 1] for s in starts])
        return x, y

    def make(seed):
        torch.manual_seed(seed)
        return CharTransformer(len(alphabet), context=context)

    @torch.no_grad()
    def evaluate(model):
        return float(_cross_entropy(model, eval_x, eval_y))

    return Task("char", f"character-level transformer (2 layers, width 64, 4 heads, "
                f"context {context}, {sum(p.numel() for p in make(0).parameters())} "
                f"parameters, vocabulary {len(alphabet)}) on scikit-learn "
                f"{sklearn.__version__}'s dataset descriptions ({len(text)} characters), "
                "batch 32, held-out loss", make, batch, _cross_entropy, evaluate,
                lambda model: list(model.named_parameters()), steps=300, eval_every=25,
                adamw_lrs=(3e-3, 1e-2, 3e-2), muon_lrs=(0.01, 0.02, 0.05, 0.1))


def make_optimizer(kind: str, model, task: Task, lr: float, adamw_lr: float):
    if kind == "AdamW":
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    options = dict(polar_method="quintic", polar_steps=5) if kind == "Muon (quintic)" else {}
    return Muon(task.muon_groups(model), lr=lr, adamw_lr=adamw_lr, **options)


def train(task: Task, kind: str, lr: float, adamw_lr: float, seed: int):
    """One seeded run; the evaluated loss every ``eval_every`` steps and the step time."""
    model = task.make_model(seed)
    opt = make_optimizer(kind, model, task, lr, adamw_lr)
    gen = torch.Generator().manual_seed(1000 + seed)
    steps, losses, step_time = [], [], 0.0
    for step in range(1, task.steps + 1):
        x, y = task.batch(gen)
        opt.zero_grad()
        task.loss(model, x, y).backward()
        began = time.perf_counter()
        opt.step()
        step_time += time.perf_counter() - began
        if step % task.eval_every == 0 or step == task.steps:
            steps.append(step)
            losses.append(task.evaluate(model))
    return steps, losses, step_time / task.steps


def tuned(task: Task, kind: str, lrs, seeds: int, adamw_lr: float = 0.0) -> dict:
    """Every rate on every seed; the rate with the lowest mean final loss and its mean curve."""
    runs = {lr: [train(task, kind, lr, adamw_lr, seed) for seed in range(seeds)]
            for lr in lrs}
    finals = {lr: float(np.mean([r[1][-1] for r in done])) for lr, done in runs.items()}
    lr = min(finals, key=finals.__getitem__)
    done = runs[lr]
    curve = np.mean([r[1] for r in done], axis=0)
    print(f"{task.name:6s} {kind:14s} " + ", ".join(f"lr {k:g}: {v:.4f}"
                                                   for k, v in finals.items()), flush=True)
    return dict(lr=lr, step=done[0][0], loss=curve.tolist(), final_loss=float(curve[-1]),
                step_time_ms=1e3 * float(np.mean([r[2] for r in done])),
                tuning={str(k): v for k, v in finals.items()})


def compare(task: Task, seeds: int) -> dict:
    adamw = tuned(task, "AdamW", task.adamw_lrs, seeds)
    muon = tuned(task, "Muon", task.muon_lrs, seeds, adamw_lr=adamw["lr"])
    quintic = tuned(task, "Muon (quintic)", (muon["lr"],), seeds, adamw_lr=adamw["lr"])
    results = {"AdamW": adamw, "Muon": muon, "Muon (quintic)": quintic}
    for r in results.values():
        r["steps_to_adamw_final_loss"] = steps_to_reach(r["step"], r["loss"],
                                                        adamw["final_loss"])
    return dict(description=task.description, steps=task.steps, seeds=seeds,
                results=results)


def table(report: dict) -> str:
    lines = ["| task | optimizer | lr | final loss | steps to AdamW's final loss | "
             "step ms |", "|---|---|---|---|---|---|"]
    for name, task in report["tasks"].items():
        for kind, r in task["results"].items():
            reach = r["steps_to_adamw_final_loss"]
            lines.append(f"| {name} ({task['steps']} steps) | {kind} | {r['lr']:g} | "
                         f"{r['final_loss']:.4f} | {reach if reach is not None else 'never'} | "
                         f"{r['step_time_ms']:.1f} |")
    notes = [f"- {name}: {task['description']}; mean of {task['seeds']} seeds"
             for name, task in report["tasks"].items()]
    return "\n".join(lines + [""] + notes + [f"- {report['machine']}"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--tasks", nargs="+", choices=("digits", "char"),
                        default=["digits", "char"])
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).parent / "results")
    parser.add_argument("--quick", action="store_true",
                        help="a few steps, one seed, one rate each (a smoke run)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    began = time.perf_counter()
    tasks = {"digits": digits_task, "char": char_task}
    report: dict = {"tasks": {}}
    for name in args.tasks:
        task = tasks[name]()
        if args.quick:
            task = Task(**{**task.__dict__, "steps": 6, "eval_every": 3,
                           "adamw_lrs": task.adamw_lrs[1:2], "muon_lrs": task.muon_lrs[:1]})
            args.seeds = 1
        report["tasks"][name] = compare(task, args.seeds)
    report["machine"] = (f"{platform.machine()}, torch {torch.__version__}, "
                         f"{torch.get_num_threads()} threads, matroot {matroot.__version__}, "
                         f"{time.perf_counter() - began:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "muon_vs_adamw.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "muon_vs_adamw.md").write_text(table(report) + "\n")
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
