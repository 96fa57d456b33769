"""What the tree's hot operations cost in calls, not time: a lookup and an eviction run a
fixed number of Python and C calls whatever the tree's size, and none of numpy's Python-level
functions (``np.unique`` on a 16-slot page cost an eviction ~30 µs, five times the rest)."""

import collections
import sys

import numpy as np
import pytest

from radixserve.cache import RadixCache
from radixserve.cpu.native import load_native
from radixserve.memory import KVSlotAllocator

PROMPT, TURN = 256, 64


def grown(page_size: int, prompts: int, convs: int, leaf: int) -> tuple[RadixCache, list]:
    """Prompts with two-turn conversations below, inserted turn by turn as an engine does
    (the tree's own slots for what matched, fresh ones for the rest); leaves of ``leaf``."""
    rng = np.random.default_rng(0)
    cache = RadixCache(page_size, KVSlotAllocator(1 << 20, page_size), matcher=load_native())
    firsts = []
    for _ in range(prompts):
        prompt = rng.integers(0, 32000, PROMPT, dtype=np.int32)
        for _ in range(convs):
            seq = np.concatenate([prompt, rng.integers(0, 32000, TURN + leaf, dtype=np.int32)])
            for end in (PROMPT + TURN, len(seq)):
                hit = cache.match_prefix(seq[:end])
                fresh = cache.allocator.alloc(end - hit.length)
                done = cache.insert(seq[:end], np.concatenate([hit.slots, fresh]))
                cache.allocator.free(np.concatenate([hit.slots, fresh])[done.match.length :])
            firsts.append(seq[: PROMPT + TURN])
    return cache, firsts


def calls(fn) -> collections.Counter:
    """Function calls made by ``fn()``: Python ones, C ones, and Python ones inside numpy
    (but for the dispatchers of its C functions, ``multiarray.py``: ``np.concatenate``'s)."""
    seen: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event == "call":
            seen["python"] += 1
            where = frame.f_code.co_filename
            seen["numpy python"] += "/numpy/" in where and not where.endswith("multiarray.py")
        elif event == "c_call":
            seen["c"] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_lookup_costs_the_same_calls_in_a_small_tree_and_a_big_one(page_size):
    counts = []
    for prompts, convs in ((2, 4), (40, 60)):
        cache, firsts = grown(page_size, prompts, convs, leaf=64)
        query = np.concatenate([firsts[-1], np.full(8, 40000, dtype=np.int32)])
        assert cache.match_prefix(query).length == PROMPT + TURN
        counts.append(calls(lambda c=cache, q=query: c.match_prefix(q)))
    assert counts[0] == counts[1]
    assert counts[0]["numpy python"] == 0
    assert counts[0]["python"] + counts[0]["c"] <= 40, counts[0]


@pytest.mark.parametrize(("page_size", "leaf"), [(16, 16), (1, 16)])
def test_evicting_a_page_costs_the_same_calls_in_a_small_tree_and_a_big_one(page_size, leaf):
    """Page 16: a one-page leaf goes whole; page 1: one token goes from a leaf's tail."""
    counts = []
    for prompts, convs in ((2, 4), (40, 60)):
        cache, _ = grown(page_size, prompts, convs, leaf)
        free_before = cache.allocator.num_free
        counts.append(calls(lambda c=cache: c.evict(page_size)))
        assert cache.allocator.num_free == free_before + page_size
        cache.check_invariants()
    # sortedcontainers merges its sublists now and then: a call or two either way
    small, big = (c["python"] + c["c"] for c in counts)
    assert abs(small - big) <= 2, counts
    assert counts[0]["numpy python"] == counts[1]["numpy python"] == 0, counts
    assert max(small, big) <= 45, counts
