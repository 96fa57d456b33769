"""The one way benchmarks time things: configurations alternate (every other round reversed,
so drift hits all alike and none always follows the same neighbour), and a comparison is
the median of the paired rounds' ratios with their min-max. The machine is shared and noisy:
nothing finer is claimed from it. Single operations of microseconds (the tree's) are timed
call by call with the garbage collector paused (``per_call``)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from statistics import median

import numpy as np


def alternating(labels: Sequence[str], rounds: int) -> list[str]:
    """The run order: A B C, C B A, A B C, ..."""
    order: list[str] = []
    for r in range(rounds):
        order += list(labels) if r % 2 == 0 else list(labels)[::-1]
    return order


def time_alternating(
    calls: dict[str, Callable[[], object]], reps: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds of each call per rep, the calls alternating as ``alternating`` orders them."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for name in alternating(list(calls), reps):
        start = time.perf_counter()
        calls[name]()
        seconds[name].append(time.perf_counter() - start)
    return seconds


def medians(seconds: dict[str, list[float]]) -> dict[str, float]:
    return {name: median(values) for name, values in seconds.items()}


def median_round(rounds: Sequence[dict], key: str = "seconds") -> dict:
    """The round whose ``key`` is the median (the upper middle one of an even count)."""
    return sorted(rounds, key=lambda r: r[key])[len(rounds) // 2]


def paired(slow: Sequence[float], fast: Sequence[float]) -> dict[str, float]:
    """``slow[i] / fast[i]`` for rounds run back to back: median, min and max."""
    ratios = [a / b for a, b in zip(slow, fast, strict=True)]
    return {"median": median(ratios), "min": min(ratios), "max": max(ratios)}


def per_call(
    items: Sequence, call: Callable[[object], object], prepare: Callable = lambda item: item
) -> np.ndarray:
    """Seconds of ``call(prepare(item))`` for each item, one call at a time (``prepare``
    untimed, just before), with the garbage collector paused so no call pays for a
    collection it did not cause."""
    out = np.empty(len(items))
    was_on = gc.isenabled()
    gc.disable()
    try:
        for i, item in enumerate(items):
            arg = prepare(item)
            start = time.perf_counter()
            call(arg)
            out[i] = time.perf_counter() - start
    finally:
        if was_on:
            gc.enable()
    return out
