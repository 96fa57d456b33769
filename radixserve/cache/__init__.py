"""Prefix caches: the radix tree, a block-hash index for comparison, a null cache for "off"."""

from radixserve.cache.base import (
    BasePrefixCache,
    CacheInvariantError,
    CacheStats,
    InsertResult,
    Namespace,
    PrefixMatch,
)
from radixserve.cache.block_hash import BlockHashCache
from radixserve.cache.null import NoPrefixCache
from radixserve.cache.radix import RadixCache
from radixserve.cache.tokens import encode_tokens

__all__ = [
    "BasePrefixCache",
    "BlockHashCache",
    "CacheInvariantError",
    "CacheStats",
    "InsertResult",
    "Namespace",
    "NoPrefixCache",
    "PrefixMatch",
    "RadixCache",
    "encode_tokens",
]
