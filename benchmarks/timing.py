"""Interleaved timing: every contender of a case is timed in turn, round after round,
so that load on the machine hits all of them alike; medians and ratios come from the
same rounds."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable


def per_call_us(fn: Callable[[], object], number: int,
                clock: Callable[[], float] = time.perf_counter) -> float:
    # As timeit does: no garbage collection inside a timed batch, so a collection
    # triggered by one contender's allocations is not charged to another.
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = clock()
        for _ in range(number):
            fn()
        return (clock() - start) / number * 1e6
    finally:
        if enabled:
            gc.enable()


def interleaved(contenders: dict[str, Callable[[], object]], *, number: int, rounds: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median microseconds per call of each contender over ``rounds`` interleaved rounds,
    by ``clock`` (wall time; ``time.thread_time``: the CPU time of this thread, which a
    busy machine's other processes do not lengthen)."""
    return {name: statistics.median(values)
            for name, values in samples(contenders, number=number, rounds=rounds,
                                        clock=clock).items()}


def samples(contenders: dict[str, Callable[[], object]], *, number: int, rounds: int,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Microseconds per call of each contender in each of ``rounds`` interleaved rounds."""
    for fn in contenders.values():  # warm up: caches, first-call imports, lazy init
        per_call_us(fn, max(1, number // 10), clock)
    found: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            found[name].append(per_call_us(fn, number, clock))
    return found
