"""Graph replay of the Shampoo step on CUDA: the steps between root refreshes, and the
refresh steps that read nothing on the host.

A step's shapes, dtypes and Python-side choices are the same from step to step of one
kind: the same kernels run on the same state memory (the state is overwritten in
place: moments, factors, counters, and at a refresh the kept roots, failure counts
and bounds). So the step is captured once per *signature* into a
``torch.cuda.CUDAGraph`` and replayed: one launch of the whole graph instead of one
per operation. The signature is everything the host decides that a captured graph
bakes in (each family's schedule — a refresh step or not, preconditioning started or
not —, ``lr``, ``weight_decay``, which parameters have a gradient, how non-finite
gradients are screened); the gradients, whose tensors torch makes anew at each
backward, are copied into the graph's own buffers before each replay (one foreach
copy).

When it runs, and the fallback (eager, the same arithmetic):

* ``graph_replay="auto"`` (the default) replays on CUDA only; on the CPU and under
  ``torch.compile`` (whose own graphs cover the step) the step runs eagerly.
* The first step of each signature runs eagerly (it makes the lazy state and the
  constants the graph then reads) and is watched for host reads (the operations
  :mod:`matroot.testing.launch_count` counts as syncs, copies to the CPU, and
  kernels that check their error codes there); the
  second is captured and replayed. A signature whose first step read the host runs
  eagerly for good (a graph cannot hold a read): so a refresh step is replayed
  when its solves keep their verdicts on the device — the default fixed-step
  solves, and with ``nonfinite_grads="skip"`` every iterative solve — and runs
  eagerly where a solve's verdict or an adaptive loop reads the host
  (``root_options`` asking for ``verdict="host"``) or an eigendecomposition checks
  its error codes there (``root_method="evd"``: :data:`CHECKED_ON_HOST`). The other
  signatures replay as before.
* A capture that fails (an operation CUDA graphs cannot hold) sends its signature
  to eager for good, with a warning, and that step runs eagerly; a second failed
  capture switches replay off for the optimizer; so do more than
  :data:`MAX_SIGNATURES` captured signatures or twice as many seen (an ``lr`` that
  changes at every step, as a scheduler's does, would capture a graph per step).
* Sharded and DTensor parameters run eagerly (collectives).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ... import _xp
from ..distributed.dtensor import is_dtensor
from ..shampoo_core import lists, skipping

__all__ = ["GRAPH_REPLAY_MODES", "MAX_SIGNATURES", "HOST_SYNCS", "CHECKED_ON_HOST", "StepGraphs",
           "ReplayedSteps", "cuda_capture", "reads_host"]

#: ``graph_replay`` values: "auto" (CUDA only), True (CUDA only, and a warning where
#: it cannot run), False (never).
GRAPH_REPLAY_MODES = ("auto", True, False)
#: Signatures captured before replay is switched off (each graph holds its own memory).
MAX_SIGNATURES = 4


def cuda_capture(step: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """``step`` captured into a CUDA graph on ``device``; returns its replay."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        step()
    torch.cuda.current_stream(device).wait_stream(stream)
    # The graph reads the cached constants by address: held for as long as it lives,
    # whatever their caches evict.
    kept = _cached_constants()

    def replay():
        graph.replay()
        return kept
    return replay


def _cached_constants() -> list:
    """The tensors matroot keeps in its constant caches (identities, 0-d constants,
    coefficient vectors), which a step reads rather than makes anew."""
    caches = [getattr(_xp.launches, name, {}) for name in ("_CONSTANTS", "_IDENTITIES")]
    caches += [lists._CONSTANTS, skipping._VECTORS]
    return [t for cache in caches for t in list(cache.values())]


#: Operations that read a value on the host: issue 35's syncs
#: (:data:`matroot.testing.launch_count.HOST_SYNCS`, a layer above this one; a test
#: holds the two equal).
HOST_SYNCS = frozenset({"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "item",
                        "masked_select", "unique", "_unique2"})
#: Operations whose kernels read their LAPACK/cuSOLVER error codes on the host (inside
#: the kernel, where no dispatcher sees a sync): an eigh or solve that checks its input.
CHECKED_ON_HOST = frozenset({
    "_linalg_eigh", "linalg_eigh", "_linalg_check_errors", "linalg_eig", "_linalg_svd",
    "linalg_inv", "linalg_solve", "linalg_cholesky", "cholesky", "linalg_lstsq"})


class _HostReads(TorchDispatchMode):
    """Notes whether an operation read a value on the host: one of :data:`HOST_SYNCS`
    or :data:`CHECKED_ON_HOST`, or a copy from a device to the CPU."""

    def __init__(self):
        super().__init__()
        self.found: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if self.found is None and (name in HOST_SYNCS or name in CHECKED_ON_HOST
                                   or _to_host(name, args, kwargs)):
            self.found = name
        return func(*args, **kwargs)


def _to_host(name, args, kwargs) -> bool:
    def on_device(t):
        return isinstance(t, torch.Tensor) and t.device.type != "cpu"

    if name == "_to_copy" and args:
        target = kwargs.get("device")
        return on_device(args[0]) and target is not None and torch.device(target).type == "cpu"
    if name == "copy_" and len(args) > 1:
        return not on_device(args[0]) and on_device(args[1])
    return False


def reads_host(step: Callable[[], None]) -> str | None:
    """Run ``step`` eagerly; the first operation it read the host with, or None.

    Examples
    --------
    >>> import torch
    >>> x = torch.ones(3)
    >>> reads_host(lambda: x.mul_(2)), reads_host(lambda: bool(x.sum() > 0))
    (None, '_local_scalar_dense')
    """
    with _HostReads() as watch:
        step()
    return watch.found


class StepGraphs:
    """The captured steps of one optimizer, by signature, and the choice to use them.

    Parameters
    ----------
    mode : "auto", True or False
        See :data:`GRAPH_REPLAY_MODES`.
    capture : callable, optional
        ``capture(step, device) -> replay``; default :func:`cuda_capture` (a test
        passes another to exercise the bookkeeping without a GPU).

    Attributes
    ----------
    replays : int
        Steps that ran as a replay.
    off_because : str or None
        Why replay was switched off (a failed capture, too many signatures).
    eager_because : dict
        Per signature whose first step read the host (so it is never captured), the
        operation that read it.
    """

    def __init__(self, mode="auto", capture: Callable | None = None):
        if mode not in GRAPH_REPLAY_MODES or (isinstance(mode, int)
                                              and not isinstance(mode, bool)):
            raise ValueError(f"graph_replay must be 'auto', True or False, got {mode!r}")
        self.mode = mode
        self._capture = capture or cuda_capture
        self._graphs: dict = {}
        self._seen: set = set()
        self.eager_because: dict = {}
        self._failed_captures = 0
        self._warned = False
        self.replays = 0
        self.off_because: str | None = None

    def wanted(self, device: torch.device, *, sharded: bool) -> bool:
        """Whether a step on ``device`` should go through :meth:`run`."""
        if self.mode is False or self.off_because is not None:
            return False
        if torch.compiler.is_compiling():
            return False
        usable = device.type == "cuda" and not sharded
        if not usable and self.mode is True and not self._warned:
            self._warned = True
            warnings.warn(f"graph_replay=True needs unsharded CUDA parameters (got {device}"
                          f"{', sharded' if sharded else ''}): the steps run eagerly",
                          RuntimeWarning, stacklevel=3)
        return usable

    def run(self, signature, step: Callable[[list], None], grads: list, device) -> None:
        """One step: ``step(grads)`` eagerly the first time ``signature`` is seen (watched
        for host reads), then, unless it read the host, captured (into buffers of its
        own for the gradients) and replayed."""
        entry = self._graphs.get(signature)
        if entry is None:
            if signature in self.eager_because:
                step(grads)
                return
            if signature not in self._seen:
                if len(self._seen) >= 2 * MAX_SIGNATURES:
                    self._switch_off(f"more than {2 * MAX_SIGNATURES} step signatures (an "
                                     "lr or weight_decay that changes every step?)")
                    step(grads)
                    return
                self._seen.add(signature)
                found = reads_host(lambda: step(grads))
                if found is not None:
                    self.eager_because[signature] = found
                return
            if len(self._graphs) >= MAX_SIGNATURES:
                self._switch_off(f"more than {MAX_SIGNATURES} captured step signatures")
                step(grads)
                return
            buffers = [[None if g is None else g.detach().clone() for g in fam]
                       for fam in grads]
            try:
                replay = self._capture(lambda: step(buffers), device)
            except Exception as err:    # any capture failure falls back to eager
                reason = f"capture failed: {type(err).__name__}: {err}"
                if self._failed_captures:
                    self._switch_off(reason)
                else:
                    self._failed_captures += 1
                    self.eager_because[signature] = reason
                    warnings.warn(f"Shampoo's graph replay: {reason}; this kind of step "
                                  "runs eagerly", RuntimeWarning, stacklevel=3)
                step(grads)
                return
            entry = self._graphs[signature] = (replay, buffers)
        replay, buffers = entry
        sources = [g for fam in grads for g in fam if g is not None]
        targets = [b for fam in buffers for b in fam if b is not None]
        if sources:
            torch._foreach_copy_(targets, sources)
        replay()
        self.replays += 1

    def _switch_off(self, reason: str) -> None:
        self.off_because = reason
        self._graphs.clear()
        self._seen.clear()
        self.eager_because.clear()
        warnings.warn(f"Shampoo's graph replay is off: {reason}; steps run eagerly",
                      RuntimeWarning, stacklevel=4)


class ReplayedSteps:
    """The optimizer's :class:`StepGraphs` and the choice for one step (a mixin of
    :class:`matroot.optim.Shampoo`)."""

    if TYPE_CHECKING:   # what the optimizer it is mixed into provides
        _families: list
        _process_group: Any

        def _update(self, jobs, grads, screen) -> None: ...

    @property
    def graphs(self) -> StepGraphs:
        """The captured steps (:mod:`matroot.optim.torch.graph_replay`):
        ``graphs.replays`` counts the replayed steps, ``graphs.off_because`` says why
        replay was switched off, ``graphs.eager_because`` which kinds of step run
        eagerly because they read the host."""
        graphs = self.__dict__.get("_graphs")
        if graphs is None:
            graphs = self.__dict__["_graphs"] = StepGraphs(
                self.__dict__.get("_graph_replay", "auto"))
        return graphs

    def _replays(self, jobs, grads, screen) -> bool:
        """Run the step as a CUDA graph replay where :class:`StepGraphs` wants it;
        False where the caller runs it eagerly."""
        device = self._families[0].params[0].device
        sharded = self._process_group is not None or any(
            is_dtensor(p) for family in self._families for p in family.params)
        if not self.graphs.wanted(device, sharded=sharded):
            return False
        signature = (screen, tuple(None if job is None else (
            id(job.config), job.schedule, tuple(job.lrs), tuple(job.decays)) for job in jobs),
            tuple(tuple(g is None for g in fam) for fam in grads))
        self.graphs.run(signature, lambda gs: self._update(jobs, gs, screen), grads, device)
        return True
