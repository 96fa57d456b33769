"""``radixserve bench cache``: latency of the radix tree's hot operations (what the tree alone
saves on a workload at a KV budget is ``simulate``'s question).

Trees are grown from a system-prompt/multi-turn shape: ``num_prompts`` long shared prompts,
each with conversations of two turns below it. A query follows one prompt and the first turn
of one conversation, then adds unseen tokens, so its hit length is known exactly.
"""

from __future__ import annotations

import argparse
import gc
from dataclasses import dataclass

import numpy as np

from radixserve.bench import common
from radixserve.cache import RadixCache
from radixserve.cpu.native import load_native
from radixserve.memory import KVSlotAllocator
from radixserve.tables import Column, TableSpec, finish, num, plot

VOCAB = 32000


@dataclass(frozen=True)
class TreeShape:
    """``num_prompts`` prompts of ``prompt_len`` tokens, ``convs`` two-turn conversations of
    ``2 * turn_len`` tokens under each; queries hit ``prompt_len + turn_len`` tokens."""

    name: str
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
        if prompt_len + 2 * convs * turn_len > tree_tokens:
            convs = (tree_tokens - prompt_len) // (2 * turn_len)
            if convs < 2:
                return None
        per_prompt = prompt_len + 2 * convs * turn_len
        si = f"{tree_tokens / 1e6:g}M" if tree_tokens >= 1e6 else f"{tree_tokens / 1e3:g}k"
        name = f"~{si} cached tokens"
        return cls(name, max(1, tree_tokens // per_prompt), prompt_len, convs, turn_len)


# The workload docs/peers.md timed SGLang's trees on: 100 prompts of 4096 tokens, 20
# conversations of 400 under each, queries hitting 4296 tokens.
PEER_SHAPE = TreeShape("peers.md workload (1.2M)", 100, 4096, 20, 200)


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
            TreeShape.for_sizes(size, hit) for size in self.tree_sizes for hit in self.hit_lens
        ]
        shapes = [s for s in shapes if s is not None]
        return [*shapes, PEER_SHAPE] if self.include_peer_shape else shapes


def build_tree(shape: TreeShape, page_size: int, rng: np.random.Generator):
    """Insert every conversation turn by turn, as an engine would; returns the cache and the
    token sequence of each conversation's first turn."""
    pages = -(-shape.tree_tokens // page_size) + shape.num_prompts * (2 * shape.convs + 1)
    pages += 4000 * -(-shape.turn_len // page_size)  # room for the insert benchmark
    allocator = KVSlotAllocator(pages * page_size, page_size)
    cache = RadixCache(page_size, allocator, matcher=load_native())
    first_turns = []
    for _ in range(shape.num_prompts):
        prompt = tokens(rng, shape.prompt_len)
        for _ in range(shape.convs):
            turns = np.concatenate([prompt, tokens(rng, 2 * shape.turn_len)])
            insert(cache, turns[: shape.hit_len])
            insert(cache, turns)
            first_turns.append(turns[: shape.hit_len])
    return cache, first_turns


def insert(cache: RadixCache, seq: np.ndarray) -> None:
    """Cache ``seq`` as a finished request leaves it: the tree's slots for what it matched,
    fresh ones for the rest; what the tree does not adopt goes back."""
    hit = cache.match_prefix(seq)
    # slots: [0, hit) the tree's, [hit, len) fresh, then the last page's padding
    slots = np.concatenate([hit.slots, cache.allocator.alloc(len(seq) - hit.length)])
    done = cache.insert(seq, slots[: len(seq)])
    cache.allocator.free(slots[done.match.length :])


def bench_lookups(shape: TreeShape, page_size: int, cfg: CacheBenchConfig) -> list[dict]:
    rng = np.random.default_rng(cfg.seed)
    cache, first_turns = build_tree(shape, page_size, rng)
    expected = shape.hit_len - shape.hit_len % page_size
    match_rounds, insert_rounds = [], []
    for _ in range(cfg.rounds):
        picks = rng.integers(0, len(first_turns), cfg.queries)
        queries = [np.concatenate([first_turns[i], unseen_tokens(rng, 64)]) for i in picks]
        if any(cache.match_prefix(q).length != expected for q in queries[:8]):
            raise AssertionError("benchmark tree does not hit the expected length")
        match_rounds.append(common.per_call(queries, cache.match_prefix))
        # Each insert extends one query's path by a new turn, as a finished request does: the
        # prefix's slots come from the tree, the new turn's are allocated beforehand.
        grown = []
        for q in queries:
            prefix = cache.match_prefix(q[: shape.hit_len])
            fresh = cache.allocator.alloc(shape.turn_len)[: shape.turn_len]
            seq = np.concatenate([q[: prefix.length], tokens(rng, shape.turn_len)])
            grown.append((seq, np.concatenate([prefix.slots, fresh])))
        insert_rounds.append(common.per_call(grown, lambda a: cache.insert(*a)))
    row = {"group": shape.name, "page_size": page_size, "tree_tokens": shape.tree_tokens}
    row["hit_len"] = expected
    return [
        {**row, "op": "match", **_best_round(match_rounds)},
        {**row, "op": "insert", **_best_round(insert_rounds)},
    ]


def bench_eviction(page_size: int, cfg: CacheBenchConfig) -> dict:
    """Evict one leaf at a time from a tree of ``evict_leaves`` leaves of one page each."""
    rng = np.random.default_rng(cfg.seed)
    leaf_len, prompts, prompt_len = max(page_size, 16), 100, 512
    tree_tokens = prompts * (prompt_len + cfg.evict_leaves // prompts * leaf_len)
    allocator = KVSlotAllocator(tree_tokens + 64 * page_size, page_size)
    cache = RadixCache(page_size, allocator, matcher=load_native())
    for _ in range(prompts):
        prompt = tokens(rng, prompt_len)
        for _ in range(cfg.evict_leaves // prompts):
            insert(cache, np.concatenate([prompt, tokens(rng, leaf_len)]))
    leaves = cache.num_evictable_leaves
    rounds = [
        common.per_call(range(cfg.evictions), lambda _: cache.evict(1)) for _ in range(cfg.rounds)
    ]
    return {
        "group": "eviction",
        "leaves": leaves,
        "page_size": page_size,
        "tree_tokens": tree_tokens,
        "hit_len": leaf_len,
        "op": "evict leaf",
        **_best_round(rounds),
    }


def run_cache_bench(cfg: CacheBenchConfig, step=lambda label: None) -> list[dict]:
    rows = []
    for page_size in cfg.page_sizes:
        for shape in cfg.shapes():
            step(f"page {page_size}: {shape.name}, hit {shape.hit_len}")
            rows += bench_lookups(shape, page_size, cfg)
            gc.collect()  # parent pointers make each old tree a cycle: drop it now
        step(f"page {page_size}: eviction")
        rows.append(bench_eviction(page_size, cfg))
    return rows


def _best_round(rounds: list[np.ndarray]) -> dict:
    """Percentiles of the round with the lowest median: on a shared machine, neighbours only
    ever add time, so the quietest round is the best estimate of the code's own cost."""
    best = min(rounds, key=np.median)
    return {"p50_us": np.percentile(best, 50) * 1e6, "p99_us": np.percentile(best, 99) * 1e6}


def tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, VOCAB, n, dtype=np.int32)


def unseen_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    """Ids outside the vocabulary the trees are built from: a query's tail never hits."""
    return rng.integers(VOCAB, 2 * VOCAB, n, dtype=np.int32)


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
)
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
    common.add_options(p, CacheBenchConfig, "page_sizes", plot=True)


def run(args: argparse.Namespace) -> int:
    cfg = common.configure(CacheBenchConfig, args, QUICK)
    total = len(cfg.page_sizes) * (len(cfg.shapes()) + 1)
    rows = common.with_progress("bench cache", total, lambda step: run_cache_bench(cfg, step))
    lines = [r | {"line": f"page {r['page_size']}, {r['group']}"} for r in rows]
    matches = [r for r in lines if r["op"] == "match"]
    return finish(
        args,
        cfg,
        {"rows": rows},
        TABLES,
        lambda path: plot(path, matches, "hit_len", ["p50_us"], "line", logx=True),
    )
