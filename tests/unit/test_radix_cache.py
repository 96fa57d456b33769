import numpy as np
import pytest

from radixserve.cache import CacheInvariantError, NoPrefixCache, RadixCache
from radixserve.memory import KVSlotAllocator

from .tree_utils import alloc_and_insert, cached_positions, snapshot

PAGE_SIZES = [1, 4, 16]


def make_cache(page_size: int, pages: int = 256) -> RadixCache:
    return RadixCache(page_size, KVSlotAllocator(pages * page_size, page_size))


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_match_returns_the_slots_first_inserted(page_size):
    cache = make_cache(page_size)
    tokens = seq(100, 5 * page_size)
    cached, slots = alloc_and_insert(cache, tokens)
    assert cached == 0
    m = cache.match_prefix(tokens + [7, 7])
    assert m.length == len(tokens)
    assert m.slots.tolist() == slots[: len(tokens)].tolist()
    cache.check_invariants()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_match_is_page_granular(page_size):
    cache = make_cache(page_size)
    tokens = seq(0, 3 * page_size + page_size // 2)
    alloc_and_insert(cache, tokens)
    aligned = 3 * page_size
    assert cache.total_size == aligned  # the partial last page is not cached
    # A query that diverges inside page 2 matches only pages 0 and 1.
    query = tokens[: 2 * page_size] + [9999] * page_size
    if page_size > 1:
        query = tokens[: 2 * page_size + page_size - 1] + [9999]
    assert cache.match_prefix(query).length == 2 * page_size
    assert cache.match_prefix(tokens[: page_size - 1]).length == 0
    assert cache.match_prefix(tokens).length == aligned
    cache.check_invariants()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_insert_reports_the_cached_prefix_and_keeps_its_own_slots(page_size):
    cache = make_cache(page_size)
    first = seq(0, 4 * page_size)
    _, first_slots = alloc_and_insert(cache, first)
    second = first[: 2 * page_size] + seq(500, 2 * page_size)
    cached, _ = alloc_and_insert(cache, second)
    assert cached == 2 * page_size
    m = cache.match_prefix(second)
    assert m.length == len(second)
    assert m.slots[: 2 * page_size].tolist() == first_slots[: 2 * page_size].tolist()
    assert cache.total_size == 6 * page_size
    cache.check_invariants()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_match_splits_an_edge_and_the_handle_covers_exactly_the_match(page_size):
    cache = make_cache(page_size)
    tokens = seq(0, 6 * page_size)
    alloc_and_insert(cache, tokens)
    m = cache.match_prefix(tokens[: 2 * page_size] + [77777] * page_size)
    assert m.length == 2 * page_size
    cache.lock(m.node)
    assert cache.protected_size == 2 * page_size
    assert cache.evictable_size == 4 * page_size
    cache.check_invariants()
    assert cache.evict(10**9) == 4 * page_size
    assert cache.match_prefix(tokens).length == 2 * page_size
    cache.unlock(m.node)
    assert cache.protected_size == 0
    cache.check_invariants()


def test_split_keeps_existing_locks_consistent():
    cache = make_cache(1)
    tokens = seq(0, 10)
    alloc_and_insert(cache, tokens)
    whole = cache.match_prefix(tokens)
    cache.lock(whole.node)
    alloc_and_insert(cache, seq(0, 4) + [50, 51])  # splits the locked edge at 4
    cache.check_invariants()
    assert cache.protected_size == 10
    assert cache.evictable_size == 2
    cache.unlock(whole.node)
    assert cache.protected_size == 0
    cache.check_invariants()


def test_namespaces_never_share():
    cache = make_cache(1)
    tokens = seq(0, 8)
    alloc_and_insert(cache, tokens, namespace="alice")
    assert cache.match_prefix(tokens, namespace="bob").length == 0
    assert cache.match_prefix(tokens).length == 0
    assert cache.match_prefix(tokens, namespace="alice").length == 8
    cached, _ = alloc_and_insert(cache, tokens, namespace="bob")
    assert cached == 0
    assert cache.total_size == 16
    slots = cached_positions(cache)
    assert slots[("alice", tuple(tokens), 7)] != slots[("bob", tuple(tokens), 7)]
    cache.check_invariants()


def test_eviction_frees_the_least_recently_used_leaf_tail_first():
    cache = make_cache(1)
    base = seq(0, 4)
    for tail in (10, 20, 30):
        alloc_and_insert(cache, base + [tail, tail + 1])
    cache.match_prefix(base + [10, 11])  # refresh the oldest branch

    def cached() -> set[tuple[int, ...]]:  # without touching the tree's clock
        return {path for _, path, _ in cached_positions(cache)}

    assert cache.evict(1) == 1  # no more than asked, from the least recent leaf's tail
    assert tuple(base + [20, 21]) not in cached() and tuple(base + [20]) in cached()
    # What is left of that leaf is still the least recent; then [30, 31] loses its tail.
    assert cache.evict(2) == 2
    assert tuple(base + [20]) not in cached()
    assert tuple(base + [30, 31]) not in cached() and tuple(base + [30]) in cached()
    assert tuple(base + [10, 11]) in cached()
    # The shared parent becomes a candidate only after its last child is gone.
    assert cache.evict(3) == 3
    assert cache.total_size == 4
    assert cache.num_evictable_leaves == 1
    assert cache.evict(1) == 1
    assert cache.total_size == 3
    cache.check_invariants()


@pytest.mark.parametrize("page_size", [4, 16])
def test_eviction_frees_whole_pages_and_keeps_the_head(page_size):
    cache = make_cache(page_size)
    tokens = seq(0, 3 * page_size)
    _, slots = alloc_and_insert(cache, tokens)
    free_before = cache.allocator.num_free
    assert cache.evict(1) == page_size
    assert cache.allocator.num_free == free_before + page_size
    m = cache.match_prefix(tokens)
    assert m.slots.tolist() == slots[: 2 * page_size].tolist()
    cache.check_invariants()


def test_a_handle_into_an_evicted_tail_cannot_be_locked():
    cache = make_cache(1)
    alloc_and_insert(cache, seq(0, 6))
    m = cache.match_prefix(seq(0, 6))
    cache.evict(2)  # the tail [4, 6) goes; m.node was the node holding it
    with pytest.raises(ValueError, match="evicted"):
        cache.lock(m.node)
    head = cache.match_prefix(seq(0, 6))
    assert head.length == 4
    cache.lock(head.node)
    cache.unlock(head.node)
    cache.check_invariants()


def test_insert_counts_as_use_for_recency():
    cache = make_cache(1)
    alloc_and_insert(cache, seq(0, 3))
    alloc_and_insert(cache, seq(100, 3))
    alloc_and_insert(cache, seq(0, 3))  # already cached: refreshes it
    cache.evict(1)
    assert cache.match_prefix(seq(0, 3)).length == 3
    assert cache.match_prefix(seq(100, 3)).length == 2


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_locked_paths_survive_any_pressure(page_size):
    cache = make_cache(page_size)
    keep = seq(0, 3 * page_size)
    alloc_and_insert(cache, keep)
    for i in range(5):
        alloc_and_insert(cache, keep[:page_size] + seq(1000 * (i + 1), 2 * page_size))
    m = cache.match_prefix(keep)
    cache.lock(m.node)
    cache.lock(m.node)
    free_before = cache.allocator.num_free
    freed = cache.evict(10**9)
    assert freed == 10 * page_size
    assert cache.allocator.num_free == free_before + freed
    assert cache.total_size == cache.protected_size == 3 * page_size
    assert cache.evict(10**9) == 0
    assert cache.match_prefix(keep).slots.tolist() == m.slots.tolist()
    cache.unlock(m.node)
    assert cache.evict(10**9) == 0  # still locked once
    cache.unlock(m.node)
    assert cache.evict(10**9) == 3 * page_size
    assert cache.allocator.num_free == cache.allocator.capacity
    cache.check_invariants()


def test_unlock_without_lock_raises():
    cache = make_cache(1)
    alloc_and_insert(cache, seq(0, 4))
    m = cache.match_prefix(seq(0, 4))
    with pytest.raises(ValueError, match="holds no lock"):
        cache.unlock(m.node)
    cache.lock(m.node)
    cache.unlock(m.node)
    with pytest.raises(ValueError):
        cache.unlock(m.node)
    cache.check_invariants()


def test_stale_and_foreign_handles_are_refused():
    cache = make_cache(1)
    alloc_and_insert(cache, seq(0, 4))
    m = cache.match_prefix(seq(0, 4))
    cache.evict(4)
    with pytest.raises(ValueError, match="evicted"):
        cache.lock(m.node)
    with pytest.raises(TypeError):
        cache.lock("not a node")


def test_miss_handle_can_be_locked_as_a_no_op():
    cache = make_cache(1)
    m = cache.match_prefix(seq(0, 4), namespace="nobody")
    assert m.length == 0 and m.slots.size == 0
    cache.lock(m.node)
    cache.unlock(m.node)
    assert cache.protected_size == 0


@pytest.mark.parametrize(
    "tokens, slots",
    [
        ([1, 2, 3], [0, 1]),
        ([1, -2, 3], [0, 1, 2]),
        ([1.0, 2.0, 3.0], [0, 1, 2]),
        ([[1, 2, 3]], [0, 1, 2]),
        ([True, False, True], [0, 1, 2]),
        ([1, 2, 3], [0, -1, 2]),
        ([1, 2, 3], [100, 101, 102]),  # not allocated
        ([1, 2, 3], [0.5, 1, 2]),
    ],
)
def test_bad_insert_leaves_the_tree_unchanged(tokens, slots):
    cache = make_cache(1)
    alloc_and_insert(cache, [1, 2, 9])
    cache.allocator.alloc(3)
    before = snapshot(cache)
    with pytest.raises(ValueError):
        cache.insert(tokens, slots)
    assert snapshot(cache) == before
    cache.check_invariants(slots_held_outside=3)


def test_insert_demands_whole_pages_in_order():
    cache = make_cache(4)
    slots = cache.allocator.alloc(8)
    shuffled = np.concatenate([slots[1:4], slots[:1], slots[4:]])
    before = snapshot(cache)
    with pytest.raises(ValueError, match="whole pages"):
        cache.insert(seq(0, 8), shuffled)
    assert snapshot(cache) == before


def test_bad_match_input_raises():
    cache = make_cache(1)
    with pytest.raises(ValueError):
        cache.match_prefix([0, -5])
    with pytest.raises(ValueError):
        cache.match_prefix([2**40])


def test_token_containers_are_interchangeable():
    cache = make_cache(1)
    tokens = seq(7, 20)
    alloc_and_insert(cache, np.array(tokens, dtype=np.int64))
    for query in (tokens, tuple(tokens), np.array(tokens, dtype=np.int32), range(7, 27)):
        assert cache.match_prefix(query).length == 20


def test_empty_inputs():
    cache = make_cache(4)
    assert cache.insert([], []).prefix_len == 0
    assert cache.match_prefix([]).length == 0
    done = cache.insert([1, 2], [0, 1])  # shorter than a page: nothing cached
    assert done.prefix_len == done.match.length == 0
    assert cache.total_size == 0
    cache.check_invariants()


def test_reset_frees_everything_and_refuses_while_locked():
    cache = make_cache(4)
    alloc_and_insert(cache, seq(0, 16))
    alloc_and_insert(cache, seq(0, 8) + seq(90, 8), namespace="t")
    m = cache.match_prefix(seq(0, 16))
    cache.lock(m.node)
    with pytest.raises(RuntimeError, match="locked"):
        cache.reset()
    cache.unlock(m.node)
    cache.reset()
    assert cache.total_size == 0
    assert cache.allocator.num_free == cache.allocator.capacity
    assert cache.stats().lookups == 0
    with pytest.raises(ValueError):
        cache.lock(m.node)
    cache.check_invariants()


def test_stats_count_tokens_and_requests():
    cache = make_cache(1)
    alloc_and_insert(cache, seq(0, 10))
    cache.match_prefix(seq(0, 10) + seq(50, 10))  # 10 of 20
    cache.match_prefix(seq(60, 5))  # miss
    stats = cache.stats()
    assert (stats.lookups, stats.hit_lookups) == (2, 1)
    assert (stats.queried_tokens, stats.hit_tokens) == (25, 10)
    assert stats.token_hit_rate == pytest.approx(0.4)
    assert stats.request_hit_rate == pytest.approx(0.5)
    assert stats.inserted_tokens == 10
    cache.evict(10)
    assert cache.stats().evicted_tokens == 10
    assert cache.stats().as_dict()["token_hit_rate"] == pytest.approx(0.4)


def test_simulation_mode_needs_no_allocator():
    cache = RadixCache(page_size=2)
    assert cache.insert(seq(0, 6), [10, 11, 12, 13, 14, 15]).prefix_len == 0
    m = cache.match_prefix(seq(0, 5))
    assert m.length == 4 and m.slots.tolist() == [10, 11, 12, 13]
    assert cache.evict(100) == 6
    cache.check_invariants()


def test_check_invariants_catches_corruption():
    cache = make_cache(1)
    alloc_and_insert(cache, seq(0, 4))
    cache.allocator.alloc(2)
    with pytest.raises(CacheInvariantError, match="capacity"):
        cache.check_invariants()
    cache.check_invariants(slots_held_outside=2)
    node = cache.match_prefix(seq(0, 4)).node
    node.lock_ref = 1  # behind the cache's back
    with pytest.raises(CacheInvariantError):
        cache.check_invariants(slots_held_outside=2)


def test_check_invariants_catches_a_slot_cached_twice():
    cache = make_cache(1)
    slots = cache.allocator.alloc(2)
    cache.insert([1, 2, 3], [slots[0], slots[1], slots[1]])
    with pytest.raises(CacheInvariantError, match="twice"):
        cache.check_invariants()


def test_allocator_page_size_must_match():
    with pytest.raises(ValueError):
        RadixCache(4, KVSlotAllocator(16, 1))


def test_pretty_print_shows_the_tree(capsys):
    cache = make_cache(1)
    alloc_and_insert(cache, seq(0, 4) + [5])
    alloc_and_insert(cache, seq(0, 4) + [6], namespace="t")
    text = cache.pretty_print()
    assert "namespace 't'" in text and "[0, 1, 2, 3, 5]" in text
    assert "total=10" in capsys.readouterr().out


def test_no_prefix_cache_never_caches():
    alloc = KVSlotAllocator(16, 1)
    cache = NoPrefixCache(1, alloc)
    slots = alloc.alloc(4)
    done = cache.insert(seq(0, 4), slots)
    assert done.prefix_len == done.match.length == 0  # adopts nothing: the caller keeps all
    m = cache.match_prefix(seq(0, 4))
    assert m.length == 0 and m.slots.size == 0
    cache.lock(m.node)
    cache.unlock(m.node)
    assert cache.evict(100) == 0
    assert cache.total_size == 0
    assert cache.stats().queried_tokens == 4 and cache.stats().hit_tokens == 0
    cache.check_invariants(slots_held_outside=4)
    with pytest.raises(CacheInvariantError):
        cache.check_invariants()
    with pytest.raises(ValueError):
        cache.insert(seq(0, 4), slots[:2])
