"""Device-honest timing: synchronise around the timed region, warm up, interleave, take medians.

Noise on a shared machine comes in bursts; timing every contender of one
configuration in the same round (round-robin) spreads a burst over all of them,
so their ratios stay honest even when absolute times wander.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from time import perf_counter
from typing import Any

__all__ = ["timed_call", "interleaved_times"]


def timed_call(fn: Callable, synchronize: Callable):
    """Run ``fn()`` once between two device synchronisations; return (seconds, result).

    Examples
    --------
    >>> from matroot.cli.timing import timed_call
    >>> seconds, value = timed_call(lambda: 2 + 2, lambda: None)
    >>> value, seconds >= 0
    (4, True)
    """
    synchronize()
    start = perf_counter()
    out = fn()
    synchronize()
    return perf_counter() - start, out


def interleaved_times(calls: dict[Hashable, tuple[Callable, float]], synchronize: Callable,
                      *, repeats: int, budget_s: float,
                      reuse_first_above_s: float | None = None
                      ) -> dict[Hashable, list[float]]:
    """Time several warmed-up callables round-robin.

    Parameters
    ----------
    calls : dict
        ``key -> (fn, first_seconds)``, where ``first_seconds`` is the duration of
        the warm-up call the caller already made.
    synchronize : callable
        The device's synchronisation.
    repeats : int
        Timed calls per key at most.
    budget_s : float
        Seconds each key may spend: a key whose warm-up took ``t`` gets
        ``clamp(budget_s // t, 1, repeats)`` timed calls, so slow contenders are
        timed once or twice and fast ones ``repeats`` times.
    reuse_first_above_s : float, optional
        A key whose warm-up took longer than this is not called again: its
        warm-up is its one sample. One-off costs (lazy initialisation, caches)
        are milliseconds, so for calls of seconds the warm-up is a fair sample,
        and skipping the second call halves the cost of the largest sizes.

    Returns
    -------
    dict
        ``key -> list of seconds``, one entry per timed call.

    Examples
    --------
    >>> from matroot.cli.timing import interleaved_times
    >>> out = interleaved_times({"a": (lambda: None, 1e-6)}, lambda: None,
    ...                         repeats=3, budget_s=1.0)
    >>> len(out["a"])
    3
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    counts = {key: max(1, min(repeats, int(budget_s // max(first, 1e-9))))
              for key, (_, first) in calls.items()}
    times: dict[Any, list[float]] = {key: [] for key in calls}
    if reuse_first_above_s is not None:
        for key, (_, first) in calls.items():
            if first > reuse_first_above_s:
                counts[key] = 0
                times[key].append(first)
    for round_index in range(max(counts.values(), default=0)):
        for key, (fn, _) in calls.items():
            if round_index < counts[key]:
                times[key].append(timed_call(fn, synchronize)[0])
    return times
