"""Benchmark rows (lists of flat dicts) as terminal tables, JSON and markdown, from one column
registry per benchmark: the terminal shows the narrow columns (80 characters), ``--wide``
and the docs show them all, the JSON keeps every key."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

Fmt = Callable[[object], str]


def num(digits: int = 1) -> Fmt:
    return lambda v: "" if v is None else f"{v:,.{digits}f}"


def pct(v: object) -> str:
    return "" if v is None else f"{v:.1%}"


def times(v: object) -> str:
    return "" if v is None else f"{v:.2f}x"


def ms(v: object) -> str:
    return "" if v is None else f"{1000 * v:.0f}"


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


def print_table(
    title: str, rows: Sequence[dict], columns: Sequence[Column], wide: bool = False
) -> None:
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
    head = "| " + " | ".join(c.header for c in present) + " |"

    def numeric(key: str) -> bool:
        return any(isinstance(r.get(key), int | float) for r in rows)

    align = "|" + "|".join("---:" if numeric(c.key) else "---" for c in present) + "|"
    body = ["| " + " | ".join(c.fmt(r.get(c.key)) for c in present) + " |" for r in rows]
    return "\n".join([head, align, *body])


T = TypeVar("T")


def with_progress(title: str, total: int, run: Callable[[Callable[[str], None]], T]) -> T:
    """Call ``run(step)`` under a transient progress bar; each ``step(label)`` advances it."""
    with Progress(transient=True) as progress:
        task = progress.add_task(title, total=total)
        return run(lambda label: progress.update(task, advance=1, description=label))


def write_json(path: str | Path, payload: dict) -> None:
    """The rows with the date and the machine they were measured on, for the report."""
    stamped = {**payload, "measured": date.today().isoformat(), "machine": machine()}
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


def finish(
    args: argparse.Namespace,
    cfg: object,
    data: dict,
    tables: Sequence[TableSpec],
    plot: Callable[[str], None] | None = None,
) -> int:
    """A benchmark's last steps: its tables on the terminal, its rows with the run's
    configuration (a dataclass) as JSON under ``--json``, its chart under ``--plot``."""
    print_tables(data, tables, args.wide)
    if args.json:
        write_json(args.json, {"config": asdict(cfg), **data})
    if plot is not None and getattr(args, "plot", None):
        return plot_or_explain(lambda: plot(args.plot))
    return 0


def plot_or_explain(plot: Callable[[], None]) -> int:
    """Run a plot, or say how to get matplotlib (an optional extra)."""
    try:
        plot()
    except ImportError:
        print("plotting needs matplotlib: pip install 'radixserve[bench]'")
        return 1
    return 0
