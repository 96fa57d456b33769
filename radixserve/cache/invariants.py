"""A full audit of a ``RadixCache``'s structure and accounting, for tests and debug mode.

It walks the whole tree (O(n)), so the engine calls it only when asked to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from radixserve.cache.base import CacheInvariantError
from radixserve.cache.tokens import TOKEN_BYTES

if TYPE_CHECKING:
    from radixserve.cache.radix import RadixCache


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CacheInvariantError(message)


def check_radix_invariants(cache: RadixCache, slots_held_outside: int = 0) -> None:
    """Raise ``CacheInvariantError`` unless every structural and accounting rule holds."""
    pb = cache.page_size * TOKEN_BYTES
    evictable = protected = 0
    evictable_leaves = 0
    all_slots = []
    for namespace, root in cache._roots.items():
        _require(root.parent is None and root.key == b"", f"root of {namespace!r} is malformed")
        _require(root.namespace == namespace, f"root of {namespace!r} has the wrong namespace")
        _require(bool(root.children), f"namespace {namespace!r} keeps an empty root")
        stack = [root]
        while stack:
            node = stack.pop()
            heads = {t: set(g.items()) for t, g in node.heads.items()}
            by_token: dict[bytes, set] = {}
            for first_page, child in node.children.items():
                by_token.setdefault(first_page[:TOKEN_BYTES], set()).add((first_page, child))
            _require(heads == by_token, "a node's first-token groups differ from its children")
            for first_page, child in node.children.items():
                _require(child.parent is node, "a child's parent pointer is wrong")
                _require(child.key[:pb] == first_page, "a child is keyed by the wrong page")
                _require(not child.evicted, "an evicted node is still in the tree")
                _require(child.namespace == namespace, "a node crossed namespaces")
                stack.append(child)
            if node is root:
                continue
            n = node.num_tokens
            _require(n > 0 and len(node.key) % pb == 0, f"edge of {n} tokens is not whole pages")
            _require(len(node.key) == n * TOKEN_BYTES, "edge and slots differ in length")
            _require(node.lock_ref >= 0, f"negative lock count {node.lock_ref}")
            if not node.parent.is_root:
                _require(
                    node.parent.lock_ref >= node.lock_ref,
                    f"parent lock {node.parent.lock_ref} < child lock {node.lock_ref}",
                )
            if node.lock_ref:
                protected += n
            else:
                evictable += n
            queued = node in cache.eviction_policy
            is_candidate = node.lock_ref == 0 and not node.children
            _require(queued == is_candidate, f"eviction queue membership wrong for {node!r}")
            evictable_leaves += is_candidate
            all_slots.append(node.slots)

    _require(
        len(cache.eviction_policy) == evictable_leaves,
        "the eviction queue holds nodes that are not candidates",
    )
    _require(evictable == cache.evictable_size, f"evictable {cache.evictable_size} != {evictable}")
    _require(protected == cache.protected_size, f"protected {cache.protected_size} != {protected}")
    total = evictable + protected
    _require(cache.total_size == total, "evictable + protected != total")

    slots = np.concatenate(all_slots) if all_slots else np.empty(0, dtype=np.int64)
    _require(np.unique(slots).size == slots.size, "a slot appears twice in the tree")
    alloc = cache.allocator
    if alloc is not None:
        _require(alloc.is_allocated(slots), "the tree holds slots the allocator thinks are free")
        _require(
            alloc.num_free + total + slots_held_outside == alloc.capacity,
            f"free {alloc.num_free} + cached {total} + held outside {slots_held_outside} "
            f"!= capacity {alloc.capacity}",
        )
