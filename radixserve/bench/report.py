"""What every benchmark shares: its command line's common options, the one way it times
things, its rows as terminal tables, JSON and markdown, and its chart.

Rows are lists of flat dicts, shown through one column registry per benchmark (``TABLES``):
the terminal shows the narrow columns (80 characters), ``--wide`` and the docs show them
all, the JSON keeps every key. Configurations alternate (every other round reversed, so
drift hits all alike); a comparison is the median of the paired rounds' ratios with their
min-max. The machine is shared and noisy: nothing finer is claimed from it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import date
from pathlib import Path
from statistics import median
from typing import TypeVar

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

T = TypeVar("T")
Fmt = Callable[[object], str]
Step = Callable[[str], None]


def num(digits: int = 1) -> Fmt:
    return lambda v: "" if v is None else f"{v:,.{digits}f}"


def pct(v: object) -> str:
    return "" if v is None else f"{v:.1%}"


def times(v: object) -> str:
    return "" if v is None else f"{v:.2f}x"


def plain(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Fmt = plain
    wide: bool = False  # shown with --wide and in the docs only


@dataclass(frozen=True)
class TableSpec:
    """One table of a benchmark: the rows under ``key`` in its JSON, and their columns."""

    key: str
    title: str
    columns: tuple[Column, ...]


# ---- the command line ----------------------------------------------------------------------


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


def with_progress(title: str, total: int, run: Callable[[Step], T]) -> T:
    """Call ``run(step)`` under a transient progress bar; each ``step(label)`` advances it."""
    with Progress(transient=True) as progress:
        task = progress.add_task(title, total=total)
        return run(lambda label: progress.update(task, advance=1, description=label))


def finish(
    args: argparse.Namespace,
    cfg: object | None,
    data: dict,
    tables: Sequence[TableSpec],
    plot: Callable[[str], None] | None = None,
) -> int:
    """A benchmark's last steps: its tables on the terminal, its rows with the run's
    configuration (a dataclass) as JSON under ``--json``, its chart under ``--plot``."""
    print_tables(data, tables, args.wide)
    if args.json:
        write_json(args.json, data if cfg is None else {"config": asdict(cfg), **data})
    if plot is not None and getattr(args, "plot", None):
        try:
            plot(args.plot)
        except ImportError:
            print("plotting needs matplotlib: pip install 'radixserve[bench]'")
            return 1
    return 0


# ---- timing --------------------------------------------------------------------------------


def alternating(labels: Sequence[str], rounds: int) -> list[str]:
    """The run order: A B C, C B A, A B C, ..."""
    order: list[str] = []
    for r in range(rounds):
        order += list(labels) if r % 2 == 0 else list(labels)[::-1]
    return order


def run_rounds(labels: Sequence[str], rounds: int, run: Callable[[str], dict], step: Step):
    """``run(label)`` for each label, alternating, ``rounds`` times: the rows by label."""
    out: dict[str, list[dict]] = {label: [] for label in labels}
    for label in alternating(labels, rounds):
        out[label].append(run(label))
        step(label)
    return out


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


def paired(name: str, slow: Sequence[float], fast: Sequence[float]) -> dict[str, float]:
    """``slow[i] / fast[i]`` for rounds run back to back: ``name`` (the median), its min
    and its max."""
    ratios = [a / b for a, b in zip(slow, fast, strict=True)]
    return {name: median(ratios), f"{name}_min": min(ratios), f"{name}_max": max(ratios)}


def per_call(items: Sequence, call: Callable, prepare: Callable = lambda item: item) -> np.ndarray:
    """Seconds of ``call(prepare(item))`` for each item (``prepare`` untimed), the garbage
    collector paused so no call pays for a collection it did not cause."""
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


# ---- output --------------------------------------------------------------------------------


def print_table(title: str, rows: Sequence[dict], columns: Sequence[Column], wide=False) -> None:
    shown = [c for c in columns if wide or not c.wide]
    table = Table(title=title)
    for c in shown:
        table.add_column(c.header, justify="right")
    for row in rows:
        table.add_row(*(c.fmt(row.get(c.key)) for c in shown))
    Console(width=1000 if wide else 80).print(table)  # wide: as wide as the columns need


def print_tables(data: dict, specs: Sequence[TableSpec], wide: bool = False) -> None:
    for spec in specs:
        if data.get(spec.key):
            print_table(spec.title, data[spec.key], spec.columns, wide)


def markdown_table(rows: Sequence[dict], columns: Sequence[Column], wide: bool = False) -> str:
    present = [c for c in columns if (wide or not c.wide) and any(c.key in r for r in rows)]
    numeric = {c.key for c in present if any(isinstance(r.get(c.key), int | float) for r in rows)}
    head = "| " + " | ".join(c.header for c in present) + " |"
    align = "|" + "|".join("---:" if c.key in numeric else "---" for c in present) + "|"
    body = ["| " + " | ".join(c.fmt(r.get(c.key)) for c in present) + " |" for r in rows]
    return "\n".join([head, align, *body])


def write_json(path: str | Path, payload: dict) -> None:
    """The rows with the date, the machine they were measured on and its CPU profile (the
    fast paths the engine took there), for the report."""
    from radixserve.cpu import probe_cpu_profile

    stamped = {
        **payload,
        "measured": date.today().isoformat(),
        "machine": machine(),
        "cpu_profile": probe_cpu_profile().to_dict(),
    }
    Path(path).write_text(json.dumps(stamped, indent=2) + "\n")


def machine() -> dict:
    """Where a benchmark ran."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory = f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def plot(path: str, rows: Sequence[dict], x: str, ys: Sequence[str], series: str, **how) -> None:
    """One panel per key of ``ys`` (a PNG at ``path``): a line per value of ``series``
    against ``x`` or, with ``bars=True``, a bar per row. ``how``: ``title``, ``logx``,
    ``logy``, ``bars``. matplotlib is an optional extra (``radixserve[bench]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ys), figsize=(5 * len(ys), 4), squeeze=False)
    for ax, y in zip(axes[0], ys, strict=True):
        if how.get("bars"):
            labels = [str(r[series]) for r in rows]
            ax.bar(labels, [r[y] for r in rows], color=[f"C{i}" for i in range(len(rows))])
            ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        else:
            for name in dict.fromkeys(r[series] for r in rows):
                line = sorted((r for r in rows if r[series] == name), key=lambda r: r[x])
                ax.plot([r[x] for r in line], [r[y] for r in line], marker="o", label=name)
            ax.set_xlabel(x)
            ax.legend(fontsize=7)
        ax.set_xscale("log" if how.get("logx") else "linear")
        ax.set_yscale("log" if how.get("logy") else "linear")
        ax.set_title(y)
        ax.grid(True, alpha=0.3)
    fig.suptitle(how.get("title", ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
