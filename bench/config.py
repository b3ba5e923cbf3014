"""What a solver-benchmark run measures: :class:`Config`, its named presets, the swept grids.

Which methods exist and which p each supports are read from the solver registry
through :mod:`matroot.cli.contenders` (:func:`methods_for`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from matroot.cli.contenders import BASELINES, all_methods, method_supports
from matroot.cli.threads import DEFAULT_THREADS

__all__ = ["Config", "PRESETS", "BASELINES", "ITERATION_GRID", "DEGREE_GRID", "TARGET_ERROR",
           "all_methods", "methods_for", "method_supports", "baselines_for", "config_to_json",
           "config_from_json"]

#: Step counts swept for the iterative methods' time-to-accuracy curves.
ITERATION_GRID = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56)
#: Degrees swept for chebyshev.
DEGREE_GRID = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384)
#: Relative error each κ's time-to-accuracy summary asks for (the issue's targets).
TARGET_ERROR = {1e2: 1e-3, 1e4: 1e-3, 1e6: 1e-2}


@dataclass
class Config:
    """What one benchmark run measures. See :data:`PRESETS` for the named ones.

    ``batches`` maps n to its batch sizes; an n without an entry gets one batch
    of about 2M matrix entries. Times: ``entry_budget_s`` bounds the repeats of
    one contender, ``max_call_s`` skips contenders predicted slower per call,
    ``reuse_first_above_s`` makes a slow warm-up the one sample. ``tta_*`` and
    ``scaling_*`` size the time-to-accuracy and scaling experiments;
    ``threads`` is the thread policy of the parent and its workers
    (:mod:`matroot.cli.threads`; 0: the libraries' default).
    """

    sizes: tuple = (128, 256, 512, 1024, 2048)
    batches: dict = field(default_factory=lambda: {128: (1, 32), 256: (16,), 512: (1, 8),
                                                   1024: (2,), 2048: (1,)})
    ps: tuple = (2, 4)
    kappa: float = 1e4
    backends: tuple | None = None
    methods: tuple | None = None
    dtype: str = "float32"
    repeats: int = 9
    entry_budget_s: float = 2.0
    max_call_s: float = 20.0
    reuse_first_above_s: float = 2.0
    matmul_block_s: float = 0.05
    tta_n: int = 256
    tta_batch: int = 8
    tta_kappas: tuple = (1e2, 1e4, 1e6)
    tta_repeats: int = 2
    tta_budget_s: float = 0.5
    tta_backend: str | None = None
    scaling_n: int = 256
    scaling_batch: int = 4
    scaling_kappas: tuple = (1e1, 3e1, 1e2, 3e2, 1e3, 3e3, 1e4, 3e4, 1e5, 3e5, 1e6)
    scaling_spectra: tuple = ("geometric", "bulk")
    experiments: tuple = ("sweep", "time_to_accuracy", "scaling")
    threads: int = DEFAULT_THREADS
    seed: int = 0

    def batches_for(self, n: int) -> tuple:
        return tuple(self.batches.get(n, (max(1, 2 ** 21 // n ** 2),)))


PRESETS = {
    "full": Config(),
    "quick": Config(sizes=(128, 256, 512), batches={128: (8,), 256: (8,), 512: (2,)},
                    repeats=3, entry_budget_s=0.5, max_call_s=2.0,
                    reuse_first_above_s=0.5, tta_n=128,
                    tta_batch=4, tta_repeats=2, tta_budget_s=0.2, scaling_n=128,
                    scaling_batch=2, scaling_kappas=(1e1, 1e2, 1e3, 1e4, 1e5, 1e6)),
    "smoke": Config(sizes=(16,), batches={16: (2,)}, repeats=1, entry_budget_s=0.0,
                    max_call_s=5.0, matmul_block_s=0.001, tta_n=16, tta_batch=2,
                    tta_kappas=(1e2,), tta_repeats=1, tta_budget_s=0.0, scaling_n=16,
                    scaling_batch=2, scaling_kappas=(1e1, 1e3)),
}


def methods_for(config: Config, p) -> list[str]:
    """The solvers of ``config`` (default all) that support root order ``p``."""
    names = all_methods() if config.methods is None else [
        m for m in config.methods if m in all_methods()]
    return [m for m in names if method_supports(m, p)]


def baselines_for(config: Config) -> list[str]:
    """The eigh baselines of ``config`` (default both)."""
    if config.methods is None:
        return list(BASELINES)
    return [m for m in config.methods if m in BASELINES]


def config_to_json(config: Config) -> dict:
    out = asdict(config)
    out["batches"] = {str(n): list(config.batches_for(n)) for n in config.sizes}
    return out


def config_from_json(data) -> Config:
    data = dict(data)
    data["batches"] = {int(n): tuple(b) for n, b in data["batches"].items()}
    for name, value in data.items():
        if isinstance(value, list):
            data[name] = tuple(value)
    return Config(**data)
