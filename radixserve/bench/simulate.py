"""Serving against the cache alone, with no model: what the scheduler does to the tree and
the allocator for one request, and a whole chat workload served that way, for simulators,
demos and benchmarks."""

from __future__ import annotations

import time

import numpy as np

from radixserve.bench.workloads import MultiTurnChat, optimal_hit_rate
from radixserve.cache import RadixCache
from radixserve.memory import KVSlotAllocator


def serve_without_model(cache: RadixCache, prompt: np.ndarray, output: np.ndarray) -> int:
    """Match ``prompt``, take slots for the rest of prompt + output, cache what the engine
    would have computed (all but the last output token, whose K/V no pass computes) and
    release what the tree did not adopt. Returns the prompt tokens served from the cache
    (the engine computes the last prompt token whatever is cached: its logits give the
    first output token).

    Evicts when short of slots; raises ``OutOfSlots`` if locked prefixes leave too little.
    """
    alloc = cache.allocator
    hit = cache.match_prefix(prompt)
    served, _, owner = cache.serving_prefix(prompt, hit, len(prompt) - 1)
    cache.lock(owner)
    try:
        sequence = np.concatenate([prompt, output[:-1]]) if len(output) else prompt
        needed = alloc.slots_needed(len(sequence) - hit.length)
        if needed > alloc.num_free:
            cache.evict(needed - alloc.num_free)
        fresh = alloc.alloc(len(sequence) - hit.length)
    finally:
        cache.unlock(owner)
    # Slot regions: [0, hit) the tree's, [hit, len) freshly computed, then page padding.
    slots = np.concatenate([hit.slots, fresh])
    done = cache.insert(sequence, slots[: len(sequence)])
    # Nothing evicted between match and insert, so `prefix_len == hit.length` unless the
    # output itself was cached before; duplicates and the unaligned tail go back.
    alloc.free(np.concatenate([slots[hit.length : done.prefix_len], slots[done.match.length :]]))
    return served


def chat_through_tree(workload: MultiTurnChat, page_size: int, capacity: int | None) -> dict:
    """Serve ``workload`` through a tree of ``capacity`` KV slots (unbounded when None) as an
    engine would, with no model: its hit rate beside the optimal (each distinct page of
    prefix computed once) and the KV memory that sharing saves."""
    requests = list(workload.requests())
    total = sum(len(r.sequence) for r in requests)
    slots = capacity or -(-total // page_size) * page_size + page_size
    cache = RadixCache(page_size, KVSlotAllocator(slots, page_size))
    latest: dict[int, int] = {}  # conversation -> its tokens so far, were nothing shared
    hits, seconds = [], []
    for req in requests:
        t0 = time.perf_counter()
        hits.append(serve_without_model(cache, req.prompt, req.output))
        seconds.append(time.perf_counter() - t0)
        latest[req.conversation] = len(req.sequence)
    prompt = sum(len(r.prompt) for r in requests)
    evicted = cache.stats().evicted_tokens
    return {
        "page_size": page_size,
        "kv_slots": slots,
        "requests": len(requests),
        "prompt_tokens": prompt,
        "hit_rate": sum(hits) / prompt,
        "optimal_hit_rate": optimal_hit_rate([(r.prompt, r.output) for r in requests], page_size),
        "request_hit_rate": sum(h > 0 for h in hits) / len(requests),
        # what sharing saves, while everything stays cached
        "memory_saved": None if evicted else 1 - cache.total_size / sum(latest.values()),
        "evicted_tokens": evicted,
        "request_p50_us": 1e6 * float(np.median(seconds)),
    }
