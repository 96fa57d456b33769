"""Serving a request against the cache alone, with no model: what the scheduler does to the
tree and the allocator for one request, for simulators, demos and benchmarks."""

from __future__ import annotations

import numpy as np

from radixserve.cache import RadixCache


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
    cache.lock(hit.node)
    try:
        sequence = np.concatenate([prompt, output[:-1]]) if len(output) else prompt
        needed = alloc.slots_needed(len(sequence) - hit.length)
        if needed > alloc.num_free:
            cache.evict(needed - alloc.num_free)
        fresh = alloc.alloc(len(sequence) - hit.length)
    finally:
        cache.unlock(hit.node)
    # Slot regions: [0, hit) the tree's, [hit, len) freshly computed, then page padding.
    slots = np.concatenate([hit.slots, fresh])
    done = cache.insert(sequence, slots[: len(sequence)])
    # Nothing evicted between match and insert, so `prefix_len == hit.length` unless the
    # output itself was cached before; duplicates and the unaligned tail go back.
    alloc.free(np.concatenate([slots[hit.length : done.prefix_len], slots[done.match.length :]]))
    return min(hit.length, (len(prompt) - 1) // cache.page_size * cache.page_size)
