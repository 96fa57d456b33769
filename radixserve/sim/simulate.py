"""``radixserve simulate TRACE``: how much KV memory buys what hit rate on a trace, and which
eviction policy to run — every policy at every capacity replayed through the real tree,
beside the trace's optimal and Belady's offline bound."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import Progress

from radixserve.sim.replay import (
    INDEXES,
    POLICIES,
    FutureUses,
    capacity_for,
    label,
    optimal,
    replay,
)
from radixserve.sim.trace import FORMATS, read_trace
from radixserve.tables import Column, TableSpec, finish, pct, plot


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
    p.add_argument(
        "--hold-per-output-token",
        type=float,
        default=0.0,
        help="keep each request locked this long per output token, in the trace's time "
        "unit (ms for Mooncake's), so concurrent requests compete for memory",
    )
    p.add_argument("--json", help="write {optimal, rows, capacity_for} here")
    p.add_argument("--plot", help="write hit rate against capacity here (PNG)")
    p.add_argument("--wide", action="store_true", help="every column, past 80 characters")


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
                    args.hold_per_output_token,
                )
            )
    best = optimal(requests, args.page_size)
    for row in rows:
        row["label"] = label(row)
        row["of_optimal"] = row["token_hit_rate"] / best["token_hit_rate"] if best else None
    needed = capacity_for(rows, best["token_hit_rate"])
    return {
        "optimal": best,
        "requests": len(requests),
        "rows": rows,
        "capacity_for": needed,
        "needed": [{"label": k, **v} for k, v in needed.items()],
    }


def _capacity(v: object) -> str:
    return "-" if v is None else f"{v:,}"


TABLES = (
    TableSpec(
        "rows",
        "token hit rate by policy and KV capacity",
        (
            Column("label", "policy"),
            Column("capacity_tokens", "capacity"),
            Column("token_hit_rate", "token hit", pct),
            Column("of_optimal", "of optimal", pct),
            Column("request_hit_rate", "request hit", pct),
            Column("evictions", "evicted", wide=True),
            Column("over_capacity", "over capacity", wide=True),
        ),
    ),
    TableSpec(
        "needed",
        "smallest capacity replayed reaching a share of the optimal",
        (
            Column("label", "policy"),
            Column("90%", "90%", _capacity),
            Column("95%", "95%", _capacity),
            Column("99%", "99%", _capacity),
        ),
    ),
)


def run(args: argparse.Namespace) -> int:
    result = simulate(args)
    best = result["optimal"]["token_hit_rate"]
    print(f"{result['requests']:,} requests; the optimal token hit rate is {best:.1%}")
    return finish(
        args,
        None,
        result,
        TABLES,
        lambda path: plot(
            path, result["rows"], "capacity_tokens", ["token_hit_rate"], "label", logx=True
        ),
    )
