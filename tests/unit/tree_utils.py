"""Test helpers that read a RadixCache's contents without touching its recency."""

from __future__ import annotations

import numpy as np

from radixserve.cache import RadixCache
from radixserve.cache.tokens import decode_tokens


def cached_positions(cache: RadixCache) -> dict[tuple, int]:
    """Map ``(namespace, tokens through the end of token i's page, i)`` to token ``i``'s slot,
    for every cached token. Keying by whole pages keeps two pages that share a first token
    apart."""
    page = cache.page_size
    out: dict[tuple, int] = {}
    for namespace, root in cache._roots.items():
        stack = [(child, ()) for child in root.children.values()]
        while stack:
            node, prefix = stack.pop()
            path = prefix + tuple(decode_tokens(node.key))
            for i, slot in enumerate(node.slots.tolist(), start=len(prefix)):
                out[(namespace, path[: (i // page + 1) * page], i)] = slot
            stack.extend((child, path) for child in node.children.values())
    return out


def snapshot(cache: RadixCache) -> tuple:
    """Everything observable about the cache, to show an operation changed nothing."""
    return (
        cache.pretty_print(max_tokens=10**6),
        cache.stats(),
        cache.evictable_size,
        cache.protected_size,
        None if cache.allocator is None else cache.allocator.num_free,
    )


def alloc_and_insert(cache: RadixCache, tokens, namespace=None) -> tuple[int, np.ndarray]:
    """Insert ``tokens`` with fresh slots the way the engine does, freeing what the cache
    does not adopt; returns (already cached length, the slots passed in)."""
    alloc = cache.allocator
    slots = alloc.alloc(len(tokens))
    done = cache.insert(tokens, slots[: len(tokens)], namespace)
    not_adopted = np.concatenate([slots[: done.prefix_len], slots[done.match.length :]])
    alloc.free(not_adopted)
    return done.prefix_len, slots
