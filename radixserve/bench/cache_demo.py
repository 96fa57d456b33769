"""``radixserve cache-demo``: a multi-turn chat workload through the radix tree alone.

Shows what prefix caching buys before any model runs: the share of prompt tokens that need
no prefill, and how much KV memory sharing saves.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

from radixserve.bench.simulate import serve_without_model
from radixserve.bench.workloads import MultiTurnChat, optimal_hit_rate
from radixserve.cache import RadixCache
from radixserve.memory import KVSlotAllocator


@dataclass(frozen=True)
class DemoResult:
    requests: int
    prompt_tokens: int
    hit_tokens: int
    optimal_hit_tokens: int
    request_hits: int
    resident_without_sharing: int
    cached_tokens: int
    evicted_tokens: int
    lookup_p50_us: float

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens

    @property
    def optimal_hit_rate(self) -> float:
        return self.optimal_hit_tokens / self.prompt_tokens

    @property
    def memory_saved(self) -> float:
        return 1 - self.cached_tokens / self.resident_without_sharing


def run_demo(
    workload: MultiTurnChat, page_size: int, capacity: int | None, progress: bool = True
) -> DemoResult:
    """Serve the workload in a tree of ``capacity`` KV slots (unbounded when None), beside
    the optimal: every distinct page of prefix computed once, the best a cache of this page
    size can do."""
    requests = list(workload.requests())
    total = sum(len(r.sequence) for r in requests)
    slots = capacity or -(-total // page_size) * page_size + page_size
    cache = RadixCache(page_size, KVSlotAllocator(slots, page_size))
    latest: dict[int, int] = {}
    hit_tokens = request_hits = 0
    lookups_ns = []
    items = track(requests, description="serving") if progress else requests
    for req in items:
        t0 = time.perf_counter_ns()
        hit = serve_without_model(cache, req.prompt, req.output)
        lookups_ns.append(time.perf_counter_ns() - t0)
        hit_tokens += hit
        request_hits += hit > 0
        latest[req.conversation] = len(req.sequence)
    prompt_tokens = sum(len(r.prompt) for r in requests)
    optimal = optimal_hit_rate([(r.prompt, r.output) for r in requests], page_size)
    return DemoResult(
        requests=len(requests),
        prompt_tokens=prompt_tokens,
        hit_tokens=hit_tokens,
        optimal_hit_tokens=round(optimal * prompt_tokens),
        request_hits=request_hits,
        resident_without_sharing=sum(latest.values()),
        cached_tokens=cache.total_size,
        evicted_tokens=cache.stats().evicted_tokens,
        lookup_p50_us=float(np.median(lookups_ns)) / 1e3,
    )


def print_demo(workload: MultiTurnChat, page_size: int, result: DemoResult) -> None:
    console = Console()
    console.print(
        f"[bold]radixserve cache-demo[/]: {workload.num_conversations} conversations x "
        f"{workload.turns} turns under {workload.num_system_prompts} system prompts of "
        f"{workload.system_prompt_len} tokens, page size {page_size}"
    )
    table = Table(show_header=False)
    r = result
    computed = r.prompt_tokens - r.hit_tokens
    table.add_row("requests", f"{r.requests}")
    table.add_row("prompt tokens", f"{r.prompt_tokens:,}")
    table.add_row("token hit rate", f"{r.token_hit_rate:.1%}  (optimal {r.optimal_hit_rate:.1%})")
    table.add_row("request hit rate", f"{r.request_hits / r.requests:.1%}")
    table.add_row(
        "prefill computed",
        f"{computed:,} tokens instead of {r.prompt_tokens:,} "
        f"({r.prompt_tokens / max(computed, 1):.1f}x less)",
    )
    table.add_row(
        "KV memory",
        f"{r.cached_tokens:,} cached slots for {r.resident_without_sharing:,} tokens of "
        f"conversations: {r.memory_saved:.1%} saved",
    )
    table.add_row("evicted tokens", f"{r.evicted_tokens:,}")
    table.add_row("cache work per request (p50)", f"{r.lookup_p50_us:.1f} µs")
    console.print(table)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--system-prompt-len", type=int, default=1024)
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--capacity", type=int, default=None, help="KV slots (default: all)")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    workload = MultiTurnChat(
        num_system_prompts=args.system_prompts,
        system_prompt_len=args.system_prompt_len,
        num_conversations=args.conversations,
        turns=args.turns,
        seed=args.seed,
    )
    print_demo(workload, args.page_size, run_demo(workload, args.page_size, args.capacity))
    return 0
