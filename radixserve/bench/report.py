"""Tables, JSON and plots for benchmark rows (lists of flat dicts)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.progress import Progress
from rich.table import Table


def print_table(title: str, rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> None:
    """``columns`` are (row key, header) pairs; floats print with one decimal."""
    table = Table(title=title)
    for _, header in columns:
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(*(_fmt(row.get(key, "")) for key, _ in columns))
    Console().print(table)


T = TypeVar("T")


def with_progress(title: str, total: int, run: Callable[[Callable[[str], None]], T]) -> T:
    """Call ``run(step)`` under a transient progress bar; each ``step(label)`` advances it."""
    with Progress(transient=True) as progress:
        task = progress.add_task(title, total=total)
        return run(lambda label: progress.update(task, advance=1, description=label))


def write_json(path: str | Path, payload: dict) -> None:
    """The rows with the date and the machine they were measured on, for the report."""
    from radixserve.bench.docs_report import machine

    stamped = {**payload, "measured": date.today().isoformat(), "machine": machine()}
    Path(path).write_text(json.dumps(stamped, indent=2) + "\n")


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
