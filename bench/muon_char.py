"""Muon against torch.optim.Muon and AdamW on a character-level MLP (issue 37's task).

The model reads 16 characters of the standard library's own Python source (the
top-level ``*.py`` files of this interpreter's ``Lib/``, sorted by name, the first
2 MB; characters outside ASCII become ``?``), embeds each in 32 dimensions, and
predicts the next one through two hidden layers of 256 (``Linear(512, 256)``,
``Linear(256, 256)``) and an output head. Training: 300 steps, batches of 128
windows from the first 90 % of the text; the loss reported is that of 4096 fixed
windows of the last 10 %, which training never sees.

The split is the same for both Muons: the two hidden weight matrices take Muon,
the embedding, the head and every vector take AdamW at ``--adamw-lr`` (3e-3); no
weight decay anywhere. The contenders:

- ``matroot``: ``matroot.optim.Muon`` with its defaults, groups with ``use_muon``;
- ``torch``: ``torch.optim.Muon`` (its defaults but ``weight_decay=0``) beside
  ``torch.optim.AdamW`` (``weight_decay=0``);
- ``adamw``: ``torch.optim.AdamW`` on every parameter.

Not installed and not a test: run it by hand::

    python -m bench muon_char --threads 1                # the table and the figure
    python -m bench muon_char --quick                    # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sysconfig
import time

import numpy as np
import torch

CONTEXT, EMBED, HIDDEN = 16, 32, 256


def load_text(limit: int = 2_000_000) -> np.ndarray:
    """The standard library's top-level sources as byte codes (non-ASCII → ``?``)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text(encoding="utf-8", errors="replace")
                   for p in sorted(root.glob("*.py")))[:limit]
    data = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    return data.astype(np.int64)


class CharMLP(torch.nn.Module):
    """Embedding → two hidden layers → head."""

    def __init__(self, vocab: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, EMBED)
        self.hidden1 = torch.nn.Linear(CONTEXT * EMBED, HIDDEN)
        self.hidden2 = torch.nn.Linear(HIDDEN, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, vocab)

    def forward(self, x):
        h = self.embed(x).flatten(1)
        h = torch.relu(self.hidden1(h))
        h = torch.relu(self.hidden2(h))
        return self.head(h)


def split(model: CharMLP) -> tuple[list, list]:
    """(hidden matrices, everything else)."""
    hidden = [model.hidden1.weight, model.hidden2.weight]
    ids = {id(p) for p in hidden}
    return hidden, [p for p in model.parameters() if id(p) not in ids]


def make_optimizers(kind: str, model: CharMLP, lr: float, adamw_lr: float, **options):
    hidden, others = split(model)
    if kind == "adamw":
        return [torch.optim.AdamW(model.parameters(), lr=adamw_lr, weight_decay=0.0)]
    if kind == "torch":
        return [torch.optim.Muon(hidden, lr=lr, weight_decay=0.0),
                torch.optim.AdamW(others, lr=adamw_lr, weight_decay=0.0)]
    from matroot.optim import Muon
    return [Muon([{"params": hidden, "use_muon": True},
                  {"params": others, "use_muon": False, "lr": adamw_lr}],
                 lr=lr, weight_decay=0.0, adamw_weight_decay=0.0, **options)]


class Data:
    def __init__(self, quick: bool = False):
        codes = load_text(200_000 if quick else 2_000_000)
        self.vocab = 128
        cut = int(0.9 * len(codes))
        self.train, self.test = codes[:cut], codes[cut:]
        gen = np.random.default_rng(1234)
        starts = gen.integers(0, len(self.test) - CONTEXT - 1, 4096)
        self.eval_x, self.eval_y = self.windows(self.test, starts)

    @staticmethod
    def windows(codes, starts):
        idx = starts[:, None] + np.arange(CONTEXT + 1)[None, :]
        w = torch.from_numpy(codes[idx])
        return w[:, :CONTEXT], w[:, CONTEXT]

    def batch(self, gen: np.random.Generator, size: int = 128):
        return self.windows(self.train, gen.integers(0, len(self.train) - CONTEXT - 1, size))


def evaluate(model, data: Data) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(data.eval_x), data.eval_y))


def train(kind: str, data: Data, *, lr: float, adamw_lr: float = 3e-3, steps: int = 300,
          seed: int = 0, eval_every: int = 25, **options) -> dict:
    """One run: the eval-loss curve and the mean optimizer step time."""
    torch.manual_seed(seed)
    model = CharMLP(data.vocab)
    optimizers = make_optimizers(kind, model, lr, adamw_lr, **options)
    gen = np.random.default_rng(seed)
    curve, step_time = [(0, evaluate(model, data))], 0.0
    for step in range(1, steps + 1):
        x, y = data.batch(gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        start = time.perf_counter()
        for opt in optimizers:
            opt.step()
        step_time += time.perf_counter() - start
        if step % eval_every == 0 or step == steps:
            curve.append((step, evaluate(model, data)))
    return {"kind": kind, "lr": lr, "seed": seed, "curve": curve, "final": curve[-1][1],
            "step_ms": 1e3 * step_time / steps}


CONTENDERS = {"matroot": (0.02, 0.05), "torch": (0.02, 0.05), "adamw": (3e-3, 1e-2)}


def use_float32_iterates() -> None:
    """torch.optim.Muon's iteration with float32 iterates instead of bfloat16 (on a
    CPU without bfloat16 arithmetic its own takes ~2 s a step here)."""
    import sys
    import torch.optim._muon as torch_muon
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from torch_muon_reference import newton_schulz_float32
    torch_muon._zeropower_via_newtonschulz = newton_schulz_float32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    parser.add_argument("--torch-bfloat16", action="store_true",
                        help="torch.optim.Muon's own bfloat16 iterates (slow on CPUs)")
    parser.add_argument("--only", nargs="*", default=list(CONTENDERS))
    parser.add_argument("--options", type=json.loads, default={},
                        help="matroot Muon options, as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not args.torch_bfloat16:
        use_float32_iterates()
    data = Data(args.quick)
    steps = 20 if args.quick else 300
    runs = []
    for kind, lrs in CONTENDERS.items():
        if kind not in args.only:
            continue
        for lr in lrs:
            for seed in range(args.seeds):
                extra = ({"adamw_lr": lr} if kind == "adamw"
                         else args.options if kind == "matroot" else {})
                run = train(kind, data, lr=lr, steps=steps, seed=seed, **extra)
                runs.append(run)
                print(f"{kind:8s} lr={lr:<6g} seed={seed} final={run['final']:.4f} "
                      f"step={run['step_ms']:.2f} ms", flush=True)
    if args.quick:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "muon_char.json").write_text(json.dumps(runs, indent=1))
    write_report(runs, args)


def write_report(runs: list[dict], args) -> None:
    """The markdown table (mean over seeds) and the loss-curve figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, fig = [], plt.figure(figsize=(6.4, 4.0))
    adamw_step = np.mean([r["step_ms"] for r in runs if r["kind"] == "adamw"] or [np.nan])
    for kind, lrs in CONTENDERS.items():
        for lr in lrs:
            mine = [r for r in runs if r["kind"] == kind and r["lr"] == lr]
            if not mine:
                continue
            curves = np.array([[loss for _, loss in r["curve"]] for r in mine])
            steps = [s for s, _ in mine[0]["curve"]]
            step_ms = float(np.mean([r["step_ms"] for r in mine]))
            rows.append(f"| {kind} | {lr:g} | {curves[:, -1].mean():.4f} | "
                        f"{curves[:, -1].min():.4f}–{curves[:, -1].max():.4f} | "
                        f"{step_ms:.2f} | {step_ms / adamw_step:.2f} |")
            plt.plot(steps, curves.mean(0), label=f"{kind}, lr {lr:g}")
    plt.xlabel("step")
    plt.ylabel("held-out loss (mean over seeds)")
    plt.ylim(top=3.2)
    plt.legend()
    plt.title("char-level MLP on the standard library's source")
    fig.tight_layout()
    fig.savefig(args.out / "muon_char.png", dpi=110)
    header = ("| optimizer | lr (Muon side; AdamW: all) | final eval loss (mean) | range over "
              "seeds | step ms | step / AdamW's |\n|---|---|---|---|---|---|\n")
    (args.out / "muon_char.md").write_text(
        header + "\n".join(rows) + f"\n\n- {args.seeds} seeds, torch "
        f"{torch.__version__}, {args.threads} thread(s); AdamW half at lr 3e-3; "
        f"torch.optim.Muon with {'bfloat16' if args.torch_bfloat16 else 'float32'} "
        "iterates\n")


if __name__ == "__main__":
    main()
