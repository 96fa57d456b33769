"""Share a system prompt's KV between two requests with the radix prefix cache.

Run: python examples/prefix_cache_basics.py
"""

import numpy as np

from radixserve import KVSlotAllocator, RadixCache

PAGE = 16
allocator = KVSlotAllocator(num_slots=4096, page_size=PAGE)
cache = RadixCache(page_size=PAGE, allocator=allocator)
rng = np.random.default_rng(0)
system = rng.integers(0, 32000, 512, dtype=np.int32)  # token ids are int32 arrays


def serve(user_tokens: np.ndarray) -> None:
    prompt = np.concatenate([system, user_tokens])
    hit = cache.match_prefix(prompt)
    cache.lock(hit.node)  # the matched prefix cannot be evicted while we use its slots
    fresh = allocator.alloc(len(prompt) - hit.length)
    # ... a model would compute K/V for prompt[hit.length:] into `fresh` here ...
    slots = np.concatenate([hit.slots, fresh])
    done = cache.insert(prompt, slots[: len(prompt)])  # the tree adopts the new whole pages
    allocator.free(slots[done.match.length :])  # the unaligned tail stays ours to free
    cache.unlock(hit.node)
    print(f"prompt {len(prompt)} tokens, {hit.length} served from the cache")


serve(rng.integers(0, 32000, 40, dtype=np.int32))
serve(rng.integers(0, 32000, 40, dtype=np.int32))
print(cache.stats())
cache.check_invariants()
