"""``radixserve simulate TRACE``: how much KV memory buys what hit rate on a trace, and which
eviction policy to run — every policy at every capacity replayed through the real tree,
beside the trace's optimal and Belady's offline bound."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from radixserve.sim.replay import INDEXES, POLICIES, FutureUses, capacity_for, optimal, replay
from radixserve.sim.trace import FORMATS, read_trace


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="a JSONL trace (Mooncake's, or radixserve's own)")
    p.add_argument("--format", default="auto", choices=FORMATS)
    p.add_argument("--block-size", type=int, default=512, help="tokens per hash id")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument(
        "--capacity-tokens", type=int, nargs="+", required=True, help="KV budgets to replay"
    )
    p.add_argument("--policy", nargs="+", default=["lru"], choices=POLICIES)
    p.add_argument("--index", nargs="+", default=["radix"], choices=INDEXES)
    p.add_argument("--json", help="write {optimal, rows, capacity_for} here")
    p.add_argument("--plot", help="write hit rate against capacity here (PNG)")


def simulate(args: argparse.Namespace) -> dict:
    requests = read_trace(Path(args.trace), args.page_size, args.block_size, args.format)
    if not requests:
        raise ValueError(f"{args.trace} holds no requests")
    runs = [
        (index, policy, capacity)
        for index in args.index
        for policy in args.policy
        if index == "radix" or policy == "lru"  # the block-hash index has LRU only
        for capacity in sorted(args.capacity_tokens)
    ]
    if not runs:
        raise ValueError("the block-hash index replays lru only")
    future = FutureUses(requests) if "belady" in args.policy else None
    rows = []
    with Progress(transient=True) as bar:
        task = bar.add_task("simulate", total=len(runs) * len(requests))
        for index, policy, capacity in runs:
            bar.update(task, description=f"{policy} {index} {capacity:,}")
            rows.append(
                replay(
                    requests,
                    args.page_size,
                    capacity,
                    policy,
                    index,
                    future,
                    lambda n: bar.update(task, advance=n),
                )
            )
    best = optimal(requests, args.page_size)
    return {
        "optimal": best,
        "requests": len(requests),
        "rows": rows,
        "capacity_for": capacity_for(rows, best["token_hit_rate"]),
    }


def print_result(result: dict) -> None:
    console = Console(width=80)
    best = result["optimal"]["token_hit_rate"]
    table = Table(title=f"{result['requests']:,} requests; optimal token hit rate {best:.1%}")
    for header in ("policy", "capacity", "token hit", "of optimal", "request hit", "evicted"):
        table.add_column(header, justify="right")
    for r in result["rows"]:
        label = r["policy"] if r["index"] == "radix" else f"{r['policy']} ({r['index']})"
        table.add_row(
            label,
            f"{r['capacity_tokens']:,}",
            f"{r['token_hit_rate']:.1%}",
            f"{r['token_hit_rate'] / best:.1%}" if best else "",
            f"{r['request_hit_rate']:.1%}",
            f"{r['evictions']:,}",
        )
    console.print(table)
    needed = Table(title="smallest capacity replayed reaching a share of the optimal")
    needed.add_column("policy", justify="right")
    shares = next(iter(result["capacity_for"].values()), {})
    for share in shares:
        needed.add_column(share, justify="right")
    for label, entry in result["capacity_for"].items():
        needed.add_row(label, *("-" if v is None else f"{v:,}" for v in entry.values()))
    console.print(needed)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    lines: dict[str, list[dict]] = {}
    for r in result["rows"]:
        label = r["policy"] if r["index"] == "radix" else f"{r['policy']} ({r['index']})"
        lines.setdefault(label, []).append(r)
    for label, rows in lines.items():
        ax.plot(
            [r["capacity_tokens"] for r in rows],
            [r["token_hit_rate"] for r in rows],
            marker="o",
            label=label,
        )
    ax.axhline(result["optimal"]["token_hit_rate"], color="k", ls="--", label="optimal")
    ax.set_xscale("log")
    ax.set_xlabel("KV capacity (tokens)")
    ax.set_ylabel("token hit rate")
    ax.set_title("radixserve simulate: hit rate against KV capacity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    import json

    result = simulate(args)
    print_result(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        try:
            plot(result, args.plot)
        except ImportError:
            print("plotting needs matplotlib: pip install 'radixserve[bench]'")
            return 1
    return 0
