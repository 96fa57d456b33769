"""What the benchmarks share: the command line's common options and the one way they time
things. Configurations alternate (every other round reversed, so drift hits all alike); a
comparison is the median of the paired rounds' ratios with their min-max: the machine is
shared and noisy, nothing finer is claimed from it."""

from __future__ import annotations

import argparse
import contextlib
import gc
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from statistics import median
from typing import TypeVar

import numpy as np
import torch
from rich.progress import Progress

T = TypeVar("T")
Step = Callable[[str], None]


def add_options(p: argparse.ArgumentParser, cls: type, names: str = "", plot=False, **helps):
    """A benchmark's options: ``--model`` and ``--seed`` where its frozen config ``cls`` has
    those fields, the fields ``names`` (``add_fields``), ``--quick``, and ``--plot``."""
    own = {f.name for f in fields(cls)}
    helps.setdefault("model", "any model argument (docs/models.md)")
    add_fields(p, cls, " ".join([n for n in ("model", "seed") if n in own] + [names]), **helps)
    p.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    if plot:
        p.add_argument("--plot", help="write a PNG chart to this file")


def add_fields(p: argparse.ArgumentParser, cls: type, names: str, **helps) -> None:
    """``--<field>`` for each field of ``cls`` in ``names`` (space-separated), its type and
    default taken from ``cls`` (so they are written once): a tuple field takes several values,
    a bool one is a switch; ``helps[field]`` is its help."""
    defaults = {f.name: getattr(cls(), f.name) for f in fields(cls)}
    for name in names.split():
        value, flag = defaults[name], "--" + name.replace("_", "-")
        how = {"help": helps.get(name, "default: %(default)s")}
        if isinstance(value, bool):
            p.add_argument(flag, action="store_true", **how)
            continue
        sample = value[0] if isinstance(value, tuple) else value
        how["type"] = str if sample is None else type(sample)
        how |= {"nargs": "+", "default": list(value)} if isinstance(value, tuple) else {}
        p.add_argument(flag, **{"default": value, **how})


def configure(cls: Callable[..., T], args: argparse.Namespace, quick: dict, **extra) -> T:
    """The benchmark's frozen config from the options named after its fields (and ``extra``),
    shrunk by ``quick`` under ``--quick``."""
    given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    cfg = cls(**(given | extra))
    return replace(cfg, **quick) if getattr(args, "quick", False) else cfg


def check_choices(kind: str, names: Iterable[str], choices: Iterable[str]) -> None:
    """A ValueError naming those of ``names`` (``kind``s) that are not among ``choices``."""
    choices = list(choices)
    if unknown := [name for name in names if name not in choices]:
        raise ValueError(f"unknown {kind} {', '.join(map(repr, unknown))}; choose from {choices}")


def with_progress(title: str, total: int, run: Callable[[Step], T]) -> T:
    """Call ``run(step)`` under a transient progress bar; each ``step(label)`` advances it."""
    with Progress(transient=True) as progress:
        task = progress.add_task(title, total=total)
        return run(lambda label: progress.update(task, advance=1, description=label))


def alternating(labels: Sequence[str], rounds: int) -> list[str]:
    """The run order: A B C, C B A, A B C, ..."""
    order: list[str] = []
    for r in range(rounds):
        order += list(labels) if r % 2 == 0 else list(labels)[::-1]
    return order


def run_rounds(
    labels: Sequence[str], rounds: int, run: Callable[[str], dict], step: Step = lambda label: None
) -> dict[str, list[dict]]:
    """``run(label)`` for each label, alternating, ``rounds`` times: the rows by label."""
    out: dict[str, list[dict]] = {label: [] for label in labels}
    for label in alternating(labels, rounds):
        out[label].append(run(label))
        step(label)
    return out


# Spins until its parent (this process) is gone, even if that one is killed before it can
# end the spinner: a session of its own takes it out of the reach of the parent's signals.
_SPIN = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


@contextlib.contextmanager
def busy_neighbour(active: bool = True):
    """For the block's length, one process spinning at the lowest priority in a session of
    its own, as a user's browser tab or build would (``nice`` does not reach across sessions:
    the kernel shares the CPUs between them first); ended after."""
    if not active:
        yield
        return
    spin = ["nice", "-n", "19", sys.executable, "-c", _SPIN]
    proc = subprocess.Popen(spin, start_new_session=True)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def time_alternating(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds of each call, the calls alternating (each warmed up once)."""
    for call in calls.values():
        call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for name in alternating(list(calls), reps):
        start = time.perf_counter()
        calls[name]()
        seconds[name].append(time.perf_counter() - start)
    return {name: median(values) for name, values in seconds.items()}


def median_round(rounds: Sequence[dict], key: str = "seconds") -> dict:
    """The round whose ``key`` is the median (the upper middle one of an even count)."""
    return sorted(rounds, key=lambda r: r[key])[len(rounds) // 2]


def paired(name: str, slow: Sequence, fast: Sequence, key: str | None = None) -> dict[str, float]:
    """``slow[i] / fast[i]`` for rounds run back to back (their figures, or their rows' ``key``):
    ``name`` (the median), its min and its max."""
    if key is not None:
        slow, fast = [r[key] for r in slow], [r[key] for r in fast]
    ratios = [a / b for a, b in zip(slow, fast, strict=True)]
    return {name: median(ratios), f"{name}_min": min(ratios), f"{name}_max": max(ratios)}


def per_call(items: Sequence, call: Callable) -> np.ndarray:
    """Seconds of ``call(item)`` for each item, the garbage collector paused so no call pays
    for a collection it did not cause."""
    out = np.empty(len(items))
    was_on = gc.isenabled()
    gc.disable()
    try:
        for i, item in enumerate(items):
            start = time.perf_counter()
            call(item)
            out[i] = time.perf_counter() - start
    finally:
        if was_on:
            gc.enable()
    return out


def timed(engine, call: Callable[[], T]) -> tuple[T, float, dict[str, float]]:
    """``call()``'s result, its seconds, and what it added to each figure of the engine's
    ``cache_stats`` (its counters' growth; a level's change)."""
    before = engine.cache_stats()
    start = time.perf_counter()
    out = call()
    seconds = time.perf_counter() - start
    after = engine.cache_stats()
    grown = {k: after[k] - v for k, v in before.items() if isinstance(v, int | float)}
    return out, seconds, grown


class BandwidthProbe:
    """A torch sum (all threads) over a tensor larger than the caches: it only reads, as a
    kernel streaming weights or K/V does, so the bytes a case must read over this bandwidth
    are that case's limit (timed beside the case, so a slow spell slows the limit too)."""

    def __init__(self) -> None:
        # twice the last-level cache, and at least 256 MiB
        sizes = [256 << 20]
        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
            text = index.read_text().strip()
            sizes.append(
                2 * int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1], 0)
            )
        self.src = torch.ones(max(sizes) // 4)

    def read(self) -> None:
        self.src.sum()

    def bandwidth(self, seconds: float) -> float:
        return self.src.numel() * 4 / seconds

    def measure(self, reps: int = 5) -> float:
        """Bytes/s, the median of ``reps`` reads."""
        return self.bandwidth(time_alternating({"read": self.read}, reps)["read"])
