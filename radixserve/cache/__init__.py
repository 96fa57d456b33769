"""Prefix caches: the radix tree, a block-hash index for comparison, a null cache for "off"."""

from radixserve.cache.base import (
    BasePrefixCache,
    CacheInvariantError,
    CacheStats,
    InsertResult,
    Namespace,
    PageHead,
    PrefixMatch,
)
from radixserve.cache.block_hash import BlockHashCache
from radixserve.cache.null import NoPrefixCache
from radixserve.cache.radix import RadixCache
from radixserve.cache.tokens import encode_tokens


def create_prefix_cache(
    index: str, page_size: int, allocator, eviction_policy: str = "lru", matcher=None
):
    """``index``: ``radix`` (with ``eviction_policy`` and the native edge ``matcher``, if
    any), ``block-hash`` (LRU), or ``off``."""
    if index == "off":
        return NoPrefixCache(page_size, allocator)
    if index == "block-hash":
        return BlockHashCache(page_size, allocator)
    if index == "radix":
        return RadixCache(page_size, allocator, eviction_policy, matcher)
    raise ValueError(f"unknown prefix cache index {index!r}")


__all__ = [
    "BasePrefixCache",
    "BlockHashCache",
    "CacheInvariantError",
    "CacheStats",
    "InsertResult",
    "Namespace",
    "NoPrefixCache",
    "PageHead",
    "PrefixMatch",
    "RadixCache",
    "create_prefix_cache",
    "encode_tokens",
]
