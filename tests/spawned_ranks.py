"""Run a function on every rank of a fresh gloo process group and collect what each saw.

Shared by the multi-process test files: each spawns one process group per world
size, runs all its scenarios in it (starting processes costs far more than the
scenarios), and checks the JSON every rank wrote. Collectives and the whole run are
bounded by the suite's hang guard (never a speed limit), and ranks still alive then
are killed, so a hang fails instead of blocking.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hang_guard import HANG_GUARD_S

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank, world, port, tmpdir, scenarios):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    result = {}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=HANG_GUARD_S))
        result["backend"] = dist.get_backend()
        result.update(scenarios(rank, world, tmpdir))
        dist.barrier()
    except Exception:
        result["error"] = traceback.format_exc()
        raise
    finally:
        with open(os.path.join(tmpdir, f"result-{world}-{rank}.json"), "w") as handle:
            json.dump(result, handle)
        if dist.is_initialized():
            dist.destroy_process_group()


def state_dict_bytes(tree) -> int:
    """Bytes of every tensor in a (nested) state dict: how the tests count a rank's state."""
    if torch.is_tensor(tree):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(state_dict_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(state_dict_bytes(v) for v in tree)
    return 0


def run_on_ranks(scenarios, world: int, tmpdir: str) -> list:
    """``scenarios(rank, world, tmpdir) -> dict`` on each of ``world`` gloo ranks.

    ``scenarios`` must be a module-level function (the ranks are spawned). Returns
    every rank's dict, with ``"backend"`` added; fails the test if a rank raised
    or the run outlived the hang guard.
    """
    context = mp.start_processes(_rank_main, args=(world, _free_port(), tmpdir, scenarios),
                                 nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + HANG_GUARD_S
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"{world} ranks still running after {HANG_GUARD_S} s (a hang)")
    except mp.ProcessRaisedException as err:
        pytest.fail(f"a rank failed:\n{err}")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    results = []
    for rank in range(world):
        with open(os.path.join(tmpdir, f"result-{world}-{rank}.json")) as handle:
            results.append(json.load(handle))
    return results


def two_then_three_ranks(scenarios, folder: str):
    """The module fixtures of a test module whose ``scenarios`` run at 2 ranks, then at 3
    (which may resume the 2-rank run's checkpoint): ``base``, ``two_ranks``,
    ``three_ranks`` and ``ranks`` (parametrized over both, yielding ``(world, results)``).
    A module binds them by name: ``base, two_ranks, three_ranks, ranks = ...``."""

    @pytest.fixture(scope="module")
    def base(tmp_path_factory):
        return tmp_path_factory.mktemp(folder)

    def run(world, base):
        tmpdir = base / f"world{world}"
        tmpdir.mkdir()
        return run_on_ranks(scenarios, world, str(tmpdir))

    @pytest.fixture(scope="module")
    def two_ranks(base):
        return run(2, base)

    @pytest.fixture(scope="module")
    def three_ranks(base, two_ranks):
        return run(3, base)      # after two_ranks: it may resume the 2-rank checkpoint

    @pytest.fixture(params=[2, 3], ids=lambda w: f"{w}ranks")
    def ranks(request):
        world = request.param
        return world, request.getfixturevalue({2: "two_ranks", 3: "three_ranks"}[world])

    return base, two_ranks, three_ranks, ranks
