"""The radix-tree prefix cache.

Each namespace has its own root, so requests in different namespaces never share a node.
Edges hold a whole number of pages; a node's children are keyed by their first page.

Eviction keeps the unlocked leaves, exactly, in the eviction policy's ordered queue
(``eviction.py``; LRU by default), so the next victim pops in O(log n) and a parent joins
the queue when its last child goes: there is no rescan of the tree per call. It frees whole
pages from the leaf's tail, no more than asked: dropping a whole 200-token leaf to make room
for one page threw away prefixes a block-hash cache, which frees block by block, kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from radixserve.cache.base import (
    BasePrefixCache,
    CacheStats,
    InsertResult,
    Namespace,
    PrefixMatch,
)
from radixserve.cache.eviction import BaseEvictionPolicy, create_eviction_policy
from radixserve.cache.invariants import check_radix_invariants
from radixserve.cache.picture import draw_radix
from radixserve.cache.radix_edges import RadixEdges
from radixserve.cache.shared_paths import group_shared_paths
from radixserve.cache.slot_checks import (
    EMPTY_SLOTS,
    check_page_size,
    check_slots,
    check_whole_pages,
)
from radixserve.cache.tokens import TOKEN_BYTES, encode_tokens
from radixserve.cache.tree_node import TreeNode
from radixserve.memory import KVSlotAllocator


class EdgeMatcher(Protocol):
    """How many of ``edge``'s leading bytes equal ``key``'s from byte ``pos``, in whole
    pages of ``page_bytes`` (the native kernels' ``matching_prefix``)."""

    def matching_prefix(self, key: bytes, pos: int, edge: bytes, page_bytes: int) -> int: ...


class RadixCache(RadixEdges, BasePrefixCache):
    """Token-id radix tree over KV slots, with reference-counted locks and leaf eviction in
    the order of ``eviction_policy`` (a name, or a policy object such as Belady's).

    With an ``allocator`` the tree returns evicted slots to it; without one it runs in
    simulation mode, where slots are plain ints (for scheduling analysis and simulators).
    ``matcher`` compares edges in native code (the engine passes the CPU kernels').
    """

    def __init__(
        self,
        page_size: int = 1,
        allocator: KVSlotAllocator | None = None,
        eviction_policy: str | BaseEvictionPolicy = "lru",
        matcher: EdgeMatcher | None = None,
    ) -> None:
        check_page_size(page_size, allocator)
        if isinstance(eviction_policy, str):
            eviction_policy = create_eviction_policy(eviction_policy)
        self.eviction_policy = eviction_policy
        # told (tokens of the path through the leaf, its slots, namespace) before an evicted
        # leaf's slots are freed: a lower tier copies the pages out here
        self.on_evict: Callable[[np.ndarray, np.ndarray, Namespace], None] | None = None
        self.page_size = page_size
        self.allocator = allocator
        self._page_bytes = page_size * TOKEN_BYTES
        # The native twin of _matching_bytes (tested against it), if given. A native _walk
        # did not pay: it is a few dict lookups and one memcmp per edge already.
        self._native = matcher
        self._clear()

    # ---- queries -------------------------------------------------------------------------

    @property
    def evictable_size(self) -> int:
        return self._evictable_size

    @property
    def protected_size(self) -> int:
        return self._protected_size

    @property
    def num_evictable_leaves(self) -> int:
        return len(self._queue)

    def stats(self) -> CacheStats:
        return CacheStats(
            lookups=self._lookups,
            hit_lookups=self._hit_lookups,
            queried_tokens=self._queried_tokens,
            hit_tokens=self._hit_tokens,
            inserted_tokens=self._inserted_tokens,
            evicted_tokens=self._evicted_tokens,
        )

    # ---- lookups and inserts -------------------------------------------------------------

    def match_prefix(
        self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None
    ) -> PrefixMatch:
        key = encode_tokens(tokens)
        path, matched = self._walk_and_split(key, namespace)
        self._touch(path)
        length = matched // TOKEN_BYTES
        self._lookups += 1
        self._queried_tokens += len(key) // TOKEN_BYTES
        if length:
            self._hit_lookups += 1
            self._hit_tokens += length
        return self._path_match(path, namespace)

    def peek_prefix(
        self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None
    ) -> tuple[int, object]:
        path, matched, _ = self._walk(encode_tokens(tokens), namespace)
        root = self._roots.get(namespace, self._detached_root)
        return matched // TOKEN_BYTES, path[-1] if path else root

    def insert(
        self,
        tokens: Sequence[int] | np.ndarray,
        slots: Sequence[int] | np.ndarray,
        namespace: Namespace = None,
    ) -> InsertResult:
        key = encode_tokens(tokens)
        slots = check_slots(slots, len(key) // TOKEN_BYTES)
        end = len(key) - len(key) % self._page_bytes
        path, matched, partial = self._walk(key[:end], namespace)
        if matched < end:
            # Only the slots the tree adopts need to be sound; check them before any change.
            new_slots = slots[matched // TOKEN_BYTES : end // TOKEN_BYTES]
            if self.allocator is not None:
                check_whole_pages(new_slots, self.allocator)
            root = self._roots.get(namespace)
            if root is None:
                root = self._roots[namespace] = TreeNode(b"", EMPTY_SLOTS, None, namespace)
        if partial is not None:
            path.append(self._split(*partial))
        if matched < end:
            parent = path[-1] if path else root
            if self._is_evictable_leaf(parent):
                self._queue.remove(parent)
            leaf = TreeNode(key[matched:end], new_slots.copy(), parent, namespace)
            parent.add_child(leaf, leaf.key[: self._page_bytes])
            self._touch(path)
            leaf.last_access = self._tick()
            leaf.hits = 1
            self._queue.add(leaf)
            self._evictable_size += leaf.num_tokens
            self._inserted_tokens += leaf.num_tokens
            path.append(leaf)
        else:
            self._touch(path)
        return InsertResult(matched // TOKEN_BYTES, self._path_match(path, namespace))

    # ---- locks ---------------------------------------------------------------------------

    def lock(self, node: object) -> None:
        node = self._check_handle(node)
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable_size -= node.num_tokens
                self._protected_size += node.num_tokens
                if not node.children:
                    self._queue.remove(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: object) -> None:
        node = self._check_handle(node)
        # A parent's count is never below its child's, so checking the deepest node suffices.
        if node.parent is not None and node.lock_ref <= 0:
            raise ValueError("unlock of a node that holds no lock")
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable_size += node.num_tokens
                self._protected_size -= node.num_tokens
                if not node.children:
                    self._queue.add(node)
            node = node.parent

    # ---- eviction ------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        freed = 0
        freed_slots = []
        while freed < num_tokens and self._queue:
            leaf = self._queue.pop()
            short = -(-(num_tokens - freed) // self.page_size) * self.page_size
            if short < leaf.num_tokens:
                # Only the leaf's tail goes: its head stays cached, with the leaf's record of
                # use. Splitting keeps handles to the tail marked evicted.
                upper = self._split(leaf, (leaf.num_tokens - short) * TOKEN_BYTES)
                upper.last_access, upper.hits = leaf.last_access, leaf.hits
            if self.on_evict is not None:
                self.on_evict(self._path_tokens(leaf), leaf.slots, leaf.namespace)
            parent = leaf.parent
            parent.remove_child(leaf.key[: self._page_bytes])
            leaf.evicted = True
            freed += leaf.num_tokens
            freed_slots.append(leaf.slots)
            if parent.parent is not None:
                if not parent.children and parent.lock_ref == 0:
                    self._queue.add(parent)
            elif not parent.children:
                del self._roots[parent.namespace]
        self._evictable_size -= freed
        self._evicted_tokens += freed
        if self.allocator is not None and freed_slots:
            one = len(freed_slots) == 1  # one leaf: its own array (numpy's cost is per call)
            self.allocator.free(freed_slots[0] if one else np.concatenate(freed_slots))
        return freed

    def reset(self) -> None:
        if self._protected_size:
            raise RuntimeError(
                f"cannot reset the prefix cache while {self._protected_size} tokens are locked"
            )
        nodes = list(self._iter_nodes())
        for node in nodes:
            node.evicted = True
        if self.allocator is not None and nodes:
            self.allocator.free(np.concatenate([n.slots for n in nodes]))
        self._clear()

    def _clear(self) -> None:
        self._roots: dict[Namespace, TreeNode] = {}
        # A miss in a namespace with no root yet returns this; locking it is a no-op.
        self._detached_root = TreeNode(b"", EMPTY_SLOTS, None, None)
        self._queue = self.eviction_policy  # exactly the unlocked leaves
        self._queue.clear()
        self._clock = 0
        self._evictable_size = 0
        self._protected_size = 0
        self._lookups = 0
        self._hit_lookups = 0
        self._queried_tokens = 0
        self._hit_tokens = 0
        self._inserted_tokens = 0
        self._evicted_tokens = 0

    # ---- inspection ----------------------------------------------------------------------

    def check_invariants(self, slots_held_outside: int = 0) -> None:
        check_radix_invariants(self, slots_held_outside)

    def shared_prefixes(
        self, nodes: Sequence[object], lengths: Sequence[int], min_len: int
    ) -> list[tuple[int, list[int]]]:
        return group_shared_paths([self._check_handle(n) for n in nodes], lengths, min_len)

    def pretty_print(self, max_tokens: int = 8) -> str:
        text = draw_radix(self, max_tokens)
        print(text)
        return text

    # ---- internals -----------------------------------------------------------------------

    def _touch(self, path: list[TreeNode]) -> None:
        """Mark ``path`` as just used; deeper nodes get later ticks."""
        if not path:
            return
        for node in path[:-1]:
            self._clock += 1
            node.last_access = self._clock
            node.hits += 1
        last = path[-1]
        queued = self._is_evictable_leaf(last)
        if queued:
            self._queue.remove(last)
        self._clock += 1
        last.last_access = self._clock
        last.hits += 1
        if queued:
            self._queue.add(last)

    def _path_match(self, path: list[TreeNode], namespace: Namespace) -> PrefixMatch:
        if not path:
            return PrefixMatch(0, EMPTY_SLOTS, self._roots.get(namespace, self._detached_root))
        slots = path[0].slots if len(path) == 1 else np.concatenate([n.slots for n in path])
        return PrefixMatch(len(slots), slots, path[-1])

    @staticmethod
    def _path_tokens(node: TreeNode) -> np.ndarray:
        parts = []
        while node.parent is not None:
            parts.append(node.key)
            node = node.parent
        return np.frombuffer(b"".join(reversed(parts)), dtype=np.int32)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    @staticmethod
    def _is_evictable_leaf(node: TreeNode) -> bool:
        return node.lock_ref == 0 and not node.children and node.parent is not None

    def _check_handle(self, node: object) -> TreeNode:
        if not isinstance(node, TreeNode):
            raise TypeError(f"expected a handle from match_prefix, got {type(node).__name__}")
        if node.evicted:
            raise ValueError("this node was evicted; lock handles before anything can evict")
        return node

    def roots(self) -> dict[Namespace, TreeNode]:
        """Each namespace's root (read-only use: walking what the tree holds)."""
        return dict(self._roots)

    def _iter_nodes(self):
        """Every non-root node, parents before children."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
