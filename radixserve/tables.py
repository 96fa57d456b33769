"""Rows of figures shown as tables, written as JSON, drawn as a chart: what the demo, the
benchmarks and ``simulate`` print. Nothing of the engine is imported here (``write_json``
stamps the CPU profile, from ``radixserve.cpu``, when it runs).

Rows are lists of flat dicts, shown through one column registry per command (``TABLES``):
the terminal shows the narrow columns (80 characters), ``--wide`` and the docs show them
all, the JSON keeps every key.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

from rich.console import Console
from rich.table import Table

Fmt = Callable[[object], str]


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
    """One table of a command: the rows under ``key`` in its JSON, and their columns."""

    key: str
    title: str
    columns: tuple[Column, ...]


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


def finish(
    args: argparse.Namespace,
    cfg: object | None,
    data: dict,
    tables: Sequence[TableSpec],
    plot: Callable[[str], None] | None = None,
) -> int:
    """A command's last steps: its tables on the terminal, its rows with the run's
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
    """Where a command ran."""
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
