"""Replaying a trace through the real prefix cache, with no model: what hit rate a KV budget
buys under each eviction policy, beside the trace's optimal (an unlimited cache).

The tree runs in simulation mode with one token per page (the page ids of ``trace.py``), so
a replay costs per edge walked, not per token. Each request is served as the engine serves
one: match and lock its prompt, make room (evicting), insert prompt and output (all but the
last output token, whose K/V no pass computes), unlock. Outputs get page ids of their own
(no later prompt names them, so they take room and never hit) unless the trace recorded
them. The last prompt token is
computed whatever is cached (its logits give the first output token), so a hit stops a page
before it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

import numpy as np

from radixserve.cache import BlockHashCache, RadixCache
from radixserve.cache.eviction import BeladyEviction, create_eviction_policy
from radixserve.cpu.native import load_native
from radixserve.sim.trace import TraceRequest

INDEXES = ("radix", "block-hash")
POLICIES = ("lru", "lfu", "belady")


def served_tokens(req: TraceRequest, pages: int, page_size: int) -> int:
    """Prompt tokens ``pages`` matched pages serve: all but the last prompt token, which is
    computed (the engine copies the head of a matched page that holds it). The engine also
    copies the head of a cached page that a prompt's next tokens begin like; a trace of
    whole-page hashes cannot see those, so replays count slightly fewer hits."""
    return min(pages * page_size, req.input_length - 1)


def optimal(requests: Sequence[TraceRequest], page_size: int) -> dict:
    """Hits with room for everything: each prompt's longest prefix seen before (in a prompt,
    or in the pages a recorded output cached)."""
    seen: set[int] = set()
    hit_tokens = hit_requests = prompt = 0
    for req in requests:
        pages = req.pages.tolist()
        hit = 0
        while hit < len(pages) and pages[hit] in seen:
            hit += 1
        seen.update(pages)
        seen.update(() if req.output_pages is None else req.output_pages.tolist())
        served = served_tokens(req, hit, page_size)
        hit_tokens += served
        hit_requests += served > 0
        prompt += req.input_length
    return _summary(hit_tokens, hit_requests, prompt, len(requests))


class FutureUses:
    """When each page is next needed after a given request, for Belady's rule: one sorted
    array of ``page * n + request`` keys over every prompt page of the trace."""

    def __init__(self, requests: Sequence[TraceRequest]) -> None:
        self.n = len(requests)
        parts = [r.pages * self.n + i for i, r in enumerate(requests) if len(r.pages)]
        self.keys = np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)

    def after(self, page: int, now: int) -> float:
        at = int(np.searchsorted(self.keys, page * self.n + now + 1))
        if at < len(self.keys) and self.keys[at] // self.n == page:
            return float(self.keys[at] % self.n)
        return math.inf


def replay(
    requests: Sequence[TraceRequest],
    page_size: int,
    capacity_tokens: int,
    policy: str = "lru",
    index: str = "radix",
    future: FutureUses | None = None,
    progress: Callable[[int], None] | None = None,
    hold_per_token: float = 0.0,
) -> dict:
    """One policy at one capacity; ``future`` is required for ``belady`` (build it once per
    trace); ``progress(n)`` is told every 1,000 requests. With ``hold_per_token`` (in the
    trace's time unit), a request keeps its sequence locked from its arrival for that long
    per output token, as a running request does: concurrent requests then compete for the
    memory, and what locks hold past the capacity is counted (``over_capacity``)."""
    capacity = capacity_tokens // page_size  # in pages: the tree's tokens
    if capacity < 1:
        raise ValueError(f"capacity_tokens {capacity_tokens} holds no page of {page_size}")
    now = 0
    if index == "block-hash":
        if policy != "lru":
            raise ValueError("the block-hash index evicts in LRU order only")
        cache = BlockHashCache(1)
    elif policy == "belady":
        if future is None:
            raise ValueError("belady needs the trace's future uses")
        # a leaf's slots are its page ids (simulation mode): its tail page is the last one
        belady = BeladyEviction(lambda node: future.after(int(node.slots[-1]), now))
        cache = RadixCache(1, eviction_policy=belady, matcher=load_native())
    else:
        cache = RadixCache(1, eviction_policy=create_eviction_policy(policy), matcher=load_native())
    named = [p for r in requests for p in (r.pages, r.output_pages) if p is not None and len(p)]
    fresh = 1 + max((int(p.max()) for p in named), default=0)
    hit_tokens = hit_requests = prompt = over = 0
    running: list[tuple[float, int, object]] = []  # (until, order, locked node)
    for now, req in enumerate(requests):
        while running and running[0][0] <= req.timestamp:
            cache.unlock(heapq.heappop(running)[2])
        tail = req.output_pages
        if tail is None:
            total = (req.input_length + max(req.output_length - 1, 0)) // page_size
            extra = max(total - len(req.pages), 0)
            tail, fresh = np.arange(fresh, fresh + extra), fresh + extra
        seq = np.concatenate([req.pages, tail])
        match = cache.match_prefix(seq)
        cache.lock(match.node)
        room = cache.total_size + len(seq) - match.length - capacity
        if room > 0:
            cache.evict(room)
        done = cache.insert(seq, seq)
        if hold_per_token > 0:
            cache.lock(done.match.node)
            until = req.timestamp + hold_per_token * req.output_length
            heapq.heappush(running, (until, now, done.match.node))
        cache.unlock(match.node)
        if cache.total_size > capacity:  # the request alone was larger than the budget
            cache.evict(cache.total_size - capacity)
        over += cache.total_size > capacity
        served = served_tokens(req, match.length, page_size)
        hit_tokens += served
        hit_requests += served > 0
        prompt += req.input_length
        if progress is not None and (now + 1) % 1000 == 0:
            progress(1000)
    if progress is not None:
        progress(len(requests) % 1000)
    return {
        "policy": policy,
        "index": index,
        "capacity_tokens": capacity_tokens,
        "page_size": page_size,
        **_summary(hit_tokens, hit_requests, prompt, len(requests)),
        "evictions": cache.stats().evicted_tokens * page_size,
        "cached_tokens": cache.total_size * page_size,
        "over_capacity": over,
    }


def capacity_for(rows: Sequence[dict], optimal_rate: float, shares=(0.9, 0.95, 0.99)) -> dict:
    """Per policy and index, the smallest capacity replayed that reaches each share of the
    optimal token hit rate (None: none of them did)."""
    out: dict[str, dict] = {}
    for row in sorted(rows, key=lambda r: r["capacity_tokens"]):
        entry = out.setdefault(label(row), {f"{s:.0%}": None for s in shares})
        for s in shares:
            if entry[f"{s:.0%}"] is None and row["token_hit_rate"] >= s * optimal_rate:
                entry[f"{s:.0%}"] = row["capacity_tokens"]
    return out


def label(row: dict) -> str:
    """A row's policy, with its index when that is not the radix tree."""
    return row["policy"] if row["index"] == "radix" else f"{row['policy']}+{row['index']}"


def _summary(hit_tokens: int, hit_requests: int, prompt: int, requests: int) -> dict:
    return {
        "token_hit_rate": hit_tokens / prompt if prompt else 0.0,
        "request_hit_rate": hit_requests / requests if requests else 0.0,
        "prefill_tokens_saved": hit_tokens,
    }
