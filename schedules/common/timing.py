"""Timing a call the same way for ours and for the libraries we compare with: the benchmarks, `tune`
and autotune (conv2d(..., autotune=True)) all use it."""

from __future__ import annotations

import statistics
import time

import numpy as np

_FLUSH = None


def flush_caches():
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = np.zeros(16 * 1024 * 1024, np.float32)  # 64 MiB: twice the 32 MiB L3 of the hosts seen so far
    _FLUSH += 1.0


def network_state(data):
    """A `before` for seconds_per_call that times a call as a layer runs inside a network at
    batch 1: the caches flushed, so its weights come from memory (a network's pass through the
    L3 once per image), then its input read back in, as the layer before just wrote it. `data`:
    the call's input, a TVM tensor or a numpy array."""
    read = data.numpy if hasattr(data, "numpy") else data.sum

    def before():
        flush_caches()
        read()

    return before


def seconds_per_call(call, number: int, repeat: int, cold: bool, before=None) -> float:
    """Median over `repeat` of the mean time of `number` calls (after one untimed call); cold:
    caches flushed before every call, outside the timed span; `before`, if given, runs there
    instead (to flush, then bring back what should be warm)."""
    call()
    times = []
    for _ in range(repeat):
        total = 0.0
        for _ in range(number):
            if before is not None:
                before()
            elif cold:
                flush_caches()
            t = time.perf_counter()
            call()
            total += time.perf_counter() - t
        times.append(total / number)
    return statistics.median(times)


def settle(threads: int, seconds: float) -> None:
    """Before one side's turn at more than one thread: let the other side's idle workers (TVM's
    pool, OpenMP's, OpenBLAS's) stop spinning, which they do for a while after a call, taking
    the cores this side's threads need."""
    if threads > 1:
        time.sleep(seconds)
