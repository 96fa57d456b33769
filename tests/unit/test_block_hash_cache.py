"""The block-hash index's own behaviour; the shared state machine covers the rest."""

import numpy as np
import pytest

from radixserve.cache import BlockHashCache
from radixserve.memory import KVSlotAllocator

from .tree_utils import alloc_and_insert


def make(page=4, pages=64):
    return BlockHashCache(page, KVSlotAllocator(page * pages, page))


def test_full_blocks_hit_and_keep_their_slots():
    cache = make()
    tokens = list(range(1, 14))  # 3 full blocks and one token
    cached, slots = alloc_and_insert(cache, tokens)
    assert cached == 0
    m = cache.match_prefix([*tokens[:12], 99])
    assert m.length == 12 and m.slots.tolist() == slots[:12].tolist()
    assert cache.match_prefix(tokens[:7]).length == 4  # whole blocks only
    assert cache.match_prefix([2, *tokens[1:]]).length == 0  # the chain starts at token 0
    assert cache.total_size == cache.evictable_size == 12
    cache.check_invariants()


def test_namespaces_never_share_blocks():
    cache = make()
    alloc_and_insert(cache, list(range(8)), namespace="alice")
    assert cache.match_prefix(list(range(8)), "bob").length == 0
    assert cache.match_prefix(list(range(8)), "alice").length == 8


def test_unlocked_blocks_stay_hit_able_and_evict_tail_first_in_lru_order():
    cache = make()
    a, b = list(range(100, 108)), list(range(200, 208))
    alloc_and_insert(cache, a)
    alloc_and_insert(cache, b)
    m = cache.match_prefix(a)
    cache.lock(m.node)
    assert cache.protected_size == 8 and cache.evictable_size == 8
    assert cache.evict(100) == 8  # only b can go
    cache.unlock(m.node)
    assert cache.match_prefix(a).length == 8  # freed, still cached
    alloc_and_insert(cache, b)
    cache.match_prefix(a)  # a is now the more recent chain
    assert cache.evict(4) == 4
    assert cache.match_prefix(b).length == 4  # b's tail went first
    assert cache.match_prefix(a).length == 8
    cache.check_invariants()


def test_bad_input_leaves_the_index_unchanged():
    cache = make()
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3, 4], [0, 1, 2])
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3, 4], np.array([1, 2, 3, 4]))  # not an allocated, aligned page
    with pytest.raises(ValueError):
        cache.insert([-1, 2, 3, 4], [0, 1, 2, 3])
    assert cache.total_size == 0
    cache.check_invariants()


def test_locks_are_checked():
    cache = make()
    alloc_and_insert(cache, list(range(8)))
    m = cache.match_prefix(list(range(8)))
    with pytest.raises(ValueError):
        cache.unlock(m.node)
    cache.evict(8)
    with pytest.raises(ValueError):
        cache.lock(m.node)  # evicted since the match
    with pytest.raises(TypeError):
        cache.lock("not a handle")
    cache.lock(cache.match_prefix([1, 2]).node)  # an empty match locks nothing


def test_pretty_print_lists_blocks(capsys):
    cache = make()
    alloc_and_insert(cache, list(range(8)))
    assert "2 blocks of 4 tokens" in cache.pretty_print()
