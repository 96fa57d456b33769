"""``radixserve bench cache``: latency of the radix tree's hot operations, and what the tree
alone saves on a multi-turn chat workload (no model).

Trees are grown from a system-prompt/multi-turn shape: ``num_prompts`` long shared prompts,
each with conversations of two turns below it. A query follows one prompt and the first turn
of one conversation, then adds unseen tokens, so its hit length is known exactly.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from radixserve.bench import plots
from radixserve.bench.report import (
    Column,
    TableSpec,
    finish,
    num,
    pct,
    with_progress,
)
from radixserve.bench.simulate import chat_through_tree, serve_without_model
from radixserve.bench.timing import per_call
from radixserve.bench.workloads import MultiTurnChat
from radixserve.cache import RadixCache
from radixserve.memory import KVSlotAllocator

VOCAB = 32000
_NO_OUTPUT = np.empty(0, dtype=np.int32)


@dataclass(frozen=True)
class TreeShape:
    """``num_prompts`` prompts of ``prompt_len`` tokens, ``convs`` two-turn conversations of
    ``2 * turn_len`` tokens under each; queries hit ``prompt_len + turn_len`` tokens."""

    name: str
    group: str
    num_prompts: int
    prompt_len: int
    convs: int
    turn_len: int

    @property
    def tree_tokens(self) -> int:
        return self.num_prompts * (self.prompt_len + 2 * self.convs * self.turn_len)

    @property
    def hit_len(self) -> int:
        return self.prompt_len + self.turn_len

    @classmethod
    def for_sizes(cls, tree_tokens: int, hit_len: int, convs: int = 20) -> TreeShape | None:
        """A shape of about ``tree_tokens`` whose queries hit ``hit_len``; None if too small."""
        turn_len = max(16, hit_len // 16 // 16 * 16)
        prompt_len = hit_len - turn_len
        per_prompt = prompt_len + 2 * convs * turn_len
        if per_prompt > tree_tokens:
            convs = (tree_tokens - prompt_len) // (2 * turn_len)
            if convs < 2:
                return None
            per_prompt = prompt_len + 2 * convs * turn_len
        name = f"{_si(tree_tokens)} tree, hit {hit_len}"
        group = f"~{_si(tree_tokens)} cached tokens"
        return cls(name, group, max(1, tree_tokens // per_prompt), prompt_len, convs, turn_len)


# The workload ../shared/peers.md timed SGLang's trees on: 100 prompts of 4096 tokens, 20
# conversations of 400 under each, queries hitting 4296 tokens.
PEER_SHAPE = TreeShape("peer workload", "peers.md workload (1.2M)", 100, 4096, 20, 200)


@dataclass(frozen=True)
class CacheBenchConfig:
    page_sizes: tuple[int, ...] = (1, 16)
    tree_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    hit_lens: tuple[int, ...] = (128, 1024, 4096, 32768)
    include_peer_shape: bool = True
    queries: int = 200
    rounds: int = 5
    evict_leaves: int = 50_000
    evictions: int = 1000
    seed: int = 0

    def shapes(self) -> list[TreeShape]:
        shapes = [
            shape
            for size in self.tree_sizes
            for hit in self.hit_lens
            if (shape := TreeShape.for_sizes(size, hit)) is not None
        ]
        return [*shapes, PEER_SHAPE] if self.include_peer_shape else shapes


def build_tree(shape: TreeShape, page_size: int, rng: np.random.Generator):
    """Insert every conversation turn by turn, as an engine would; returns the cache and the
    token sequence of each conversation's first turn."""
    pages = -(-shape.tree_tokens // page_size) + shape.num_prompts * (2 * shape.convs + 1)
    pages += 4000 * -(-shape.turn_len // page_size)  # room for the insert benchmark
    cache = RadixCache(page_size, KVSlotAllocator(pages * page_size, page_size))
    first_turns = []
    for _ in range(shape.num_prompts):
        prompt = _tokens(rng, shape.prompt_len)
        for _ in range(shape.convs):
            turns = np.concatenate([prompt, _tokens(rng, 2 * shape.turn_len)])
            for end in (shape.hit_len, len(turns)):
                _insert(cache, turns[:end])
            first_turns.append(turns[: shape.hit_len])
    return cache, first_turns


def bench_lookups(shape: TreeShape, page_size: int, cfg: CacheBenchConfig) -> list[dict]:
    rng = np.random.default_rng(cfg.seed)
    cache, first_turns = build_tree(shape, page_size, rng)
    expected = shape.hit_len - shape.hit_len % page_size
    match_rounds, insert_rounds = [], []
    for _ in range(cfg.rounds):
        picks = rng.integers(0, len(first_turns), cfg.queries)
        queries = [np.concatenate([first_turns[i], _unseen_tokens(rng, 64)]) for i in picks]
        for q in queries[:8]:
            if cache.match_prefix(q).length != expected:
                raise AssertionError("benchmark tree does not hit the expected length")
        match_rounds.append(per_call(queries, cache.match_prefix))
        # Each insert extends one query's path by a new turn, as a finished request does: the
        # prefix's slots come from the tree, the new turn's are allocated beforehand.
        grown, slots = [], []
        for q in queries:
            prefix = cache.match_prefix(q[: shape.hit_len])
            grown.append(np.concatenate([q[: prefix.length], _tokens(rng, shape.turn_len)]))
            fresh = cache.allocator.alloc(shape.turn_len)[: shape.turn_len]
            slots.append(np.concatenate([prefix.slots, fresh]))
        insert_rounds.append(
            per_call(list(zip(grown, slots, strict=True)), lambda a: cache.insert(*a))
        )
    base = {
        "shape": shape.name,
        "group": shape.group,
        "page_size": page_size,
        "tree_tokens": shape.tree_tokens,
        "hit_len": expected,
    }
    return [
        {**base, "op": "match", **_best_round(match_rounds)},
        {**base, "op": "insert", **_best_round(insert_rounds)},
    ]


def bench_eviction(page_size: int, cfg: CacheBenchConfig) -> dict:
    """Evict one leaf at a time from a tree of ``evict_leaves`` leaves of one page each."""
    rng = np.random.default_rng(cfg.seed)
    leaf_len = max(page_size, 16)
    prompts, prompt_len = 100, 512
    per_prompt = cfg.evict_leaves // prompts
    capacity = prompts * (prompt_len + per_prompt * leaf_len) + 64 * page_size
    cache = RadixCache(page_size, KVSlotAllocator(capacity, page_size))
    for _ in range(prompts):
        prompt = _tokens(rng, prompt_len)
        for _ in range(per_prompt):
            _insert(cache, np.concatenate([prompt, _tokens(rng, leaf_len)]))
    leaves = cache.num_evictable_leaves
    evict_rounds = [
        per_call(range(cfg.evictions), lambda _: cache.evict(1)) for _ in range(cfg.rounds)
    ]
    return {
        "shape": f"{_si(leaves)} evictable leaves",
        "group": "eviction",
        "leaves": leaves,
        "page_size": page_size,
        "tree_tokens": prompts * (prompt_len + per_prompt * leaf_len),
        "hit_len": leaf_len,
        "op": "evict leaf",
        **_best_round(evict_rounds),
    }


def run_cache_bench(
    cfg: CacheBenchConfig, on_step: Callable[[str], None] | None = None
) -> list[dict]:
    rows = []
    for page_size in cfg.page_sizes:
        for shape in cfg.shapes():
            if on_step:
                on_step(f"page {page_size}: {shape.name}")
            rows += bench_lookups(shape, page_size, cfg)
            gc.collect()  # parent pointers make each old tree a cycle: drop it now
        if on_step:
            on_step(f"page {page_size}: eviction")
        rows.append(bench_eviction(page_size, cfg))
    return rows


def num_steps(cfg: CacheBenchConfig) -> int:
    return len(cfg.page_sizes) * (len(cfg.shapes()) + 1)


def _insert(cache: RadixCache, tokens: np.ndarray) -> None:
    serve_without_model(cache, tokens, _NO_OUTPUT)


def _best_round(rounds: list[np.ndarray]) -> dict:
    """Percentiles of the round with the lowest median: on a shared machine, neighbours only
    ever add time, so the quietest round is the best estimate of the code's own cost."""
    best = min(rounds, key=np.median)
    return {
        "p50_us": float(np.percentile(best, 50)) * 1e6,
        "p99_us": float(np.percentile(best, 99)) * 1e6,
        "samples": len(best),
        "rounds": len(rounds),
    }


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, VOCAB, n, dtype=np.int32)


def _unseen_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    """Ids outside the vocabulary the trees are built from: a query's tail never hits."""
    return rng.integers(VOCAB, 2 * VOCAB, n, dtype=np.int32)


def _si(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1000)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return str(n)


TABLES = (
    TableSpec(
        "rows",
        "radix tree latency (best of rounds)",
        (
            Column("page_size", "page"),
            Column("group", "tree", wide=True),
            Column("tree_tokens", "cached tokens"),
            Column("hit_len", "tokens/op"),
            Column("op", "op"),
            Column("p50_us", "p50 µs", num(1)),
            Column("p99_us", "p99 µs", num(1)),
        ),
    ),
    TableSpec(
        "chat",
        "a multi-turn chat workload through the tree alone",
        (
            Column("page_size", "page"),
            Column("kv_slots", "KV slots"),
            Column("requests", "requests", wide=True),
            Column("hit_rate", "hit rate", pct),
            Column("optimal_hit_rate", "optimal", pct),
            Column("request_hit_rate", "requests hit", pct, wide=True),
            Column("memory_saved", "KV saved", pct),
            Column("evicted_tokens", "evicted"),
            Column("request_p50_us", "µs/request", num(1)),
        ),
    ),
)
# 64 conversations x 4 turns under 4 system prompts of 1,024 tokens (16 x 2 when quick)
CHAT = MultiTurnChat()
QUICK_CHAT = MultiTurnChat(num_conversations=16, turns=2)
QUICK = {
    "tree_sizes": (10_000,),
    "hit_lens": (128, 1024),
    "include_peer_shape": False,
    "queries": 50,
    "rounds": 1,
    "evict_leaves": 2000,
    "evictions": 200,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--quick", action="store_true", help="a small grid, for smoke tests")
    p.add_argument("--capacity", type=int, help="KV slots for the chat workload too")
    p.add_argument("--plot", help="write a PNG chart to this file")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    cfg = CacheBenchConfig(page_sizes=tuple(args.page_sizes), seed=args.seed)
    if args.quick:
        cfg = replace(cfg, **QUICK)
    rows = with_progress("bench cache", num_steps(cfg), lambda step: run_cache_bench(cfg, step))
    chat = QUICK_CHAT if args.quick else CHAT
    capacities = [None] if args.capacity is None else [None, args.capacity]
    data = {
        "rows": rows,
        "chat": [chat_through_tree(chat, p, c) for p in cfg.page_sizes for c in capacities],
    }
    return finish(args, cfg, data, TABLES, lambda path: plots.plot_cache_bench(rows, path))
