"""Eviction policies order the tree's unlocked leaves; the tree keeps its rules under each."""

import numpy as np
import pytest

from radixserve.cache import RadixCache
from radixserve.cache.eviction import BeladyEviction, create_eviction_policy
from radixserve.memory import KVSlotAllocator


def tree(policy, slots=64):
    return RadixCache(4, KVSlotAllocator(slots, 4), eviction_policy=policy)


def put(cache, tokens):
    """Serve ``tokens`` as the engine would: match and lock, make room, insert."""
    hit = cache.match_prefix(tokens)
    cache.lock(hit.node)
    missing = len(tokens) - hit.length - cache.allocator.num_free
    if missing > 0:
        cache.evict(missing)
    fresh = cache.allocator.alloc(len(tokens) - hit.length)
    cache.unlock(hit.node)
    done = cache.insert(tokens, np.concatenate([hit.slots, fresh]))
    cache.allocator.free(fresh[: done.prefix_len - hit.length])


def cached(cache, tokens) -> int:
    return cache.peek_prefix(tokens)[0]


HOT, COLD = [1] * 16, [[k + 2] * 16 for k in range(3)]


@pytest.mark.parametrize(("policy", "hot_stays"), [("lru", False), ("lfu", True)])
def test_a_frequently_used_prefix_outlives_a_scan_under_lfu_only(policy, hot_stays):
    cache = tree(policy, slots=48)  # room for three 16-token sequences
    for _ in range(4):
        put(cache, HOT)
    for seq in COLD:  # a scan of sequences used once
        put(cache, seq)
        cache.check_invariants()
    assert (cached(cache, HOT) == 16) == hot_stays


def test_lfu_ages_out_what_was_popular_long_ago():
    cache = tree("lfu", slots=32)  # room for two
    for _ in range(3):
        put(cache, HOT)
    for _ in range(6):  # a stream of new sequences, each used a few times
        for seq in COLD:
            put(cache, seq)
            put(cache, seq)
    assert cached(cache, HOT) == 0
    cache.check_invariants()


def test_belady_evicts_the_leaf_needed_farthest_ahead():
    future = {2: 5.0, 3: 1.0}  # the first token of each leaf -> when it is next needed
    policy = BeladyEviction(lambda node: future.get(int(node.key[0]), float("inf")))
    cache = tree(policy, slots=48)
    for seq in ([2] * 16, [3] * 16, [4] * 16):
        put(cache, seq)
    cache.evict(16)
    assert cached(cache, [4] * 16) == 0  # never needed again
    cache.evict(16)
    assert cached(cache, [2] * 16) == 0 and cached(cache, [3] * 16) == 16
    cache.check_invariants()


def test_an_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="lru"):
        create_eviction_policy("fifo")
