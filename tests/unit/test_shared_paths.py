"""Which running requests share a tree path: the groups cascade attention reads once."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.cache import BlockHashCache, RadixCache
from radixserve.memory import KVSlotAllocator

from .tree_utils import alloc_and_insert


def make_cache(page: int = 4) -> RadixCache:
    return RadixCache(page, KVSlotAllocator(4096 * page, page))


def handles(cache, prompts):
    return [cache.match_prefix(p) for p in prompts]


def test_requests_under_one_system_prompt_form_one_group():
    cache = make_cache()
    system = list(range(1000, 1064))
    prompts = [system + [i] * 8 for i in range(4)] + [[7] * 40]
    for p in prompts:
        alloc_and_insert(cache, p)
    matches = handles(cache, prompts)
    full = [m.length for m in matches]
    groups = cache.shared_prefixes([m.node for m in matches], full, min_len=32)
    assert groups == [(64, [0, 1, 2, 3])]
    for shared_len, members in groups:
        first = matches[members[0]].slots[:shared_len]
        assert all(np.array_equal(matches[i].slots[:shared_len], first) for i in members)
    assert cache.shared_prefixes([m.node for m in matches], full, min_len=100) == []
    # A request reading only 40 tokens from the tree offers only whole nodes within them.
    short = cache.shared_prefixes([m.node for m in matches], [40, *full[1:]], min_len=32)
    assert short == [(64, [1, 2, 3])]


def test_deeper_groups_win_when_they_save_more():
    cache = make_cache()
    system = list(range(1000, 1008))  # short common part
    a, b = system + [1] * 120, system + [2] * 120  # two long few-shot contexts
    prompts = [a + [i] * 4 for i in range(3)] + [b + [i] * 4 for i in range(3)]
    for p in prompts:
        alloc_and_insert(cache, p)
    nodes = [m.node for m in handles(cache, prompts)]
    assert sorted(cache.shared_prefixes(nodes, [132] * 6, min_len=4)) == [
        (128, [0, 1, 2]),
        (128, [3, 4, 5]),
    ]


def test_roots_and_other_indexes_share_nothing():
    cache = make_cache()
    miss = cache.match_prefix([5] * 16)
    assert cache.shared_prefixes([miss.node, miss.node], [0, 0], min_len=1) == []
    block = BlockHashCache(4, KVSlotAllocator(256, 4))
    assert block.shared_prefixes([None, None], [0, 0], min_len=1) == []


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=24), min_size=1, max_size=10),
    min_len=st.integers(1, 12),
    cut=st.integers(0, 24),
)
def test_groups_are_true_and_disjoint(prompts, min_len, cut):
    cache = make_cache(page=1)
    for p in prompts:
        alloc_and_insert(cache, p)
    matches = handles(cache, prompts)
    lengths = [m.length if i % 2 else min(m.length, cut) for i, m in enumerate(matches)]
    groups = cache.shared_prefixes([m.node for m in matches], lengths, min_len)
    seen = set()
    for shared_len, members in groups:
        assert len(members) >= 2 and shared_len >= min_len
        assert not seen & set(members)
        seen |= set(members)
        first = matches[members[0]].slots[:shared_len]
        for i in members:
            assert lengths[i] >= shared_len
            assert np.array_equal(matches[i].slots[:shared_len], first)
