"""Drive each prefix index with random operations against a plain reference model.

For the radix tree the reference is, per namespace, a map from every cached position ``i``
(keyed by the tokens through the end of its page) to its slot: the set of inserted
sequences, page-aligned, with first-insert-wins slots. For the block-hash index it is a map
from (block hash, offset) to slot, with the hash chain computed here from the tokens.
"""

import functools

import hypothesis.strategies as st
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from radixserve.cache import RadixCache
from radixserve.cache.block_hash import BlockHashCache, block_hash, root_hash
from radixserve.memory import KVSlotAllocator

from .tree_utils import cached_positions

NAMESPACES = st.sampled_from([None, "a", "b"])
TOKENS = st.lists(st.integers(0, 3), max_size=40)


class RadixCacheMachine(RuleBasedStateMachine):
    sequences = Bundle("sequences")

    @initialize(page_size=st.sampled_from([1, 2, 4, 16]))
    def setup(self, page_size):
        self.page_size = page_size
        self.cache = self.make_cache(page_size, KVSlotAllocator(256 * page_size, page_size))
        self.ref: dict[tuple, int] = {}
        self.locked: list[tuple] = []  # (namespace, tokens, length, slots, node)

    # ---- the reference ---------------------------------------------------------------

    make_cache = RadixCache

    def contents(self) -> dict:
        return cached_positions(self.cache)

    def record(self, tokens, namespace, cached, slots) -> None:
        aligned = len(tokens) - len(tokens) % self.page_size
        for i in range(cached, aligned):
            self.ref[self.ref_key(tokens, namespace, i)] = int(slots[i])

    def ref_match(self, tokens, namespace) -> list[int]:
        slots = []
        for i in range(len(tokens) - len(tokens) % self.page_size):
            slot = self.ref.get(self.ref_key(tokens, namespace, i))
            if slot is None:
                break
            slots.append(slot)
        return slots[: len(slots) - len(slots) % self.page_size]

    def ref_page_heads(self, tokens, namespace, start) -> tuple[int, list[list[int]]]:
        """The most of ``tokens[start:]`` (under a page) that a cached page at ``start``
        begins with, and the slots of each page beginning with that many."""
        page, best, found = self.page_size, 0, []
        want = tuple(tokens[start : start + page - 1])
        for (ns, key, i), _ in self.ref.items():
            if ns != namespace or i != start or key[:start] != tuple(tokens[:start]):
                continue
            n = 0
            while n < len(want) and key[start + n] == want[n]:
                n += 1
            if n and n >= best:
                found = found if n == best else []
                best = n
                found.append([self.ref[(ns, key, start + j)] for j in range(n)])
        return best, found

    def ref_key(self, tokens, namespace, i) -> tuple:
        return (namespace, tuple(tokens[: (i // self.page_size + 1) * self.page_size]), i)

    # ---- rules -------------------------------------------------------------------------

    @rule(target=sequences, tokens=TOKENS, namespace=NAMESPACES)
    def insert(self, tokens, namespace):
        return self._insert(tokens, namespace)

    @rule(target=sequences, base=sequences, tail=TOKENS, cut=st.integers(0, 40))
    def insert_branch(self, base, tail, cut):
        tokens, namespace = base
        return self._insert(tokens[:cut] + tail, namespace)

    def _insert(self, tokens, namespace):
        needed = self.cache.allocator.slots_needed(len(tokens))
        short = needed - self.cache.allocator.num_free
        if short > 0:
            self.cache.evict(short)
            self.ref = self.contents()
        if self.cache.allocator.num_free < needed:
            return (tokens, namespace)
        expected = len(self.ref_match(tokens, namespace))
        alloc = self.cache.allocator
        slots = alloc.alloc(len(tokens))
        done = self.cache.insert(tokens, slots[: len(tokens)], namespace)
        assert done.prefix_len == expected
        alloc.free(np.concatenate([slots[: done.prefix_len], slots[done.match.length :]]))
        self.record(tokens, namespace, done.prefix_len, slots)
        # the path it hands back is what a match of the sequence would give
        assert done.match.length == len(tokens) - len(tokens) % self.page_size
        assert done.match.slots.tolist() == self.ref_match(tokens, namespace)
        return (tokens, namespace)

    @rule(item=sequences, extra=TOKENS)
    def peek(self, item, extra):
        tokens, namespace = item
        # no split, no recency refresh (the picture shows both), no counters
        before = (self.cache.pretty_print(), self.cache.stats())
        length, _ = self.cache.peek_prefix(tokens + extra, namespace)
        assert length == len(self.ref_match(tokens + extra, namespace))
        assert (self.cache.pretty_print(), self.cache.stats()) == before

    @rule(item=sequences, extra=TOKENS, other_namespace=NAMESPACES)
    def match(self, item, extra, other_namespace):
        tokens, namespace = item
        for query, ns in ((tokens + extra, namespace), (tokens, other_namespace)):
            m = self.cache.match_prefix(query, ns)
            assert m.slots.tolist() == self.ref_match(query, ns)
            assert m.length == len(m.slots)
            head = self.cache.match_page_head(query, m)
            best, found = self.ref_page_heads(query, ns, m.length)
            if best == 0:
                assert head is None
            else:
                assert head.length == best and head.slots.tolist() in found

    @rule(item=sequences, cut=st.integers(0, 40))
    def lock(self, item, cut):
        tokens, namespace = item
        m = self.cache.match_prefix(tokens[:cut], namespace)
        self.cache.lock(m.node)
        self.locked.append((namespace, tokens[:cut], m.length, m.slots.tolist(), m.node))

    @precondition(lambda self: self.locked)
    @rule(index=st.integers(0, 100))
    def unlock(self, index):
        *_, node = self.locked.pop(index % len(self.locked))
        self.cache.unlock(node)

    @rule(num_tokens=st.integers(0, 200))
    def evict(self, num_tokens):
        before = self.contents()
        evictable = self.cache.evictable_size
        free_before = self.cache.allocator.num_free
        freed = self.cache.evict(num_tokens)
        assert min(num_tokens, evictable) <= freed <= evictable
        assert self.cache.allocator.num_free == free_before + freed
        after = self.contents()
        assert after.items() <= before.items()
        assert len(before) - len(after) == freed
        self.ref = after

    @rule()
    def reset(self):
        if any(length for _, _, length, _, _ in self.locked):
            try:
                self.cache.reset()
            except RuntimeError:
                return
            raise AssertionError("reset succeeded while cached tokens were locked")
        self.cache.reset()
        self.ref = {}
        self.locked = []

    # ---- checked after every step -------------------------------------------------------

    @invariant()
    def accounting_holds(self):
        self.cache.check_invariants()
        assert self.contents() == self.ref

    @invariant()
    def locked_prefixes_stay_cached(self):
        for namespace, tokens, length, slots, _ in self.locked:
            assert self.ref_match(tokens, namespace)[:length] == slots


RadixCacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRadixCacheMachine = RadixCacheMachine.TestCase


class LFURadixCacheMachine(RadixCacheMachine):
    """The same tree with LFU eviction: a different order, the same rules."""

    make_cache = functools.partial(RadixCache, eviction_policy="lfu")


LFURadixCacheMachine.TestCase.settings = RadixCacheMachine.TestCase.settings
TestLFURadixCacheMachine = LFURadixCacheMachine.TestCase


class BlockHashCacheMachine(RadixCacheMachine):
    """The same operations on the block-hash index. Evicting a block whose children stay
    cached orphans them: still counted, unreachable until their prefix is cached again."""

    make_cache = BlockHashCache

    def chain(self, tokens, namespace) -> list[bytes]:
        out, h, page = [], root_hash(namespace), self.page_size
        data = np.asarray(tokens, dtype=np.int32).tobytes()
        for start in range(0, len(tokens) - len(tokens) % page, page):
            h = block_hash(h, data[start * 4 : (start + page) * 4])
            out.append(h)
        return out

    def contents(self) -> dict:
        return {
            (h, j): int(slot)
            for h, block in self.cache._blocks.items()
            for j, slot in enumerate(block.slots)
        }

    def ref_match(self, tokens, namespace) -> list[int]:
        slots = []
        for h in self.chain(tokens, namespace):
            if (h, 0) not in self.ref:
                break
            slots += [self.ref[(h, j)] for j in range(self.page_size)]
        return slots

    def ref_page_heads(self, tokens, namespace, start) -> tuple[int, list[list[int]]]:
        return 0, []  # whole-page hashes say nothing about part of a page

    def record(self, tokens, namespace, cached, slots) -> None:
        page = self.page_size
        for k, h in enumerate(self.chain(tokens, namespace)):
            if k * page >= cached:  # new, or replacing an orphan
                for j in range(page):
                    self.ref[(h, j)] = int(slots[k * page + j])


BlockHashCacheMachine.TestCase.settings = RadixCacheMachine.TestCase.settings
TestBlockHashCacheMachine = BlockHashCacheMachine.TestCase
