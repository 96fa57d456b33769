"""The "cache off" prefix cache: nothing is ever cached."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixserve.cache.base import (
    BasePrefixCache,
    CacheInvariantError,
    CacheStats,
    InsertResult,
    Namespace,
    PrefixMatch,
)
from radixserve.cache.tokens import TOKEN_BYTES, encode_tokens
from radixserve.memory import KVSlotAllocator

_EMPTY = np.empty(0, dtype=np.int64)


class NoPrefixCache(BasePrefixCache):
    """Every lookup misses and every insert leaves all slots with the caller."""

    retains = False

    def __init__(self, page_size: int = 1, allocator: KVSlotAllocator | None = None) -> None:
        self.page_size = page_size
        self.allocator = allocator
        self._lookups = 0
        self._queried_tokens = 0

    def match_prefix(
        self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None
    ) -> PrefixMatch:
        self._lookups += 1
        self._queried_tokens += len(encode_tokens(tokens)) // TOKEN_BYTES
        return PrefixMatch(0, _EMPTY, None)

    def peek_prefix(
        self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None
    ) -> tuple[int, object]:
        return 0, None

    def insert(
        self,
        tokens: Sequence[int] | np.ndarray,
        slots: Sequence[int] | np.ndarray,
        namespace: Namespace = None,
    ) -> InsertResult:
        num_tokens = len(encode_tokens(tokens)) // TOKEN_BYTES
        if len(slots) != num_tokens:
            raise ValueError(f"got {len(slots)} slots for {num_tokens} tokens")
        return InsertResult(0, PrefixMatch(0, _EMPTY, None))  # every slot stays the caller's

    def lock(self, node: object) -> None:
        pass

    def unlock(self, node: object) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        self._lookups = 0
        self._queried_tokens = 0

    def stats(self) -> CacheStats:
        return CacheStats(lookups=self._lookups, queried_tokens=self._queried_tokens)

    def check_invariants(self, slots_held_outside: int = 0) -> None:
        alloc = self.allocator
        if alloc is not None and alloc.num_free + slots_held_outside != alloc.capacity:
            raise CacheInvariantError(
                f"free {alloc.num_free} + held outside {slots_held_outside} "
                f"!= capacity {alloc.capacity}"
            )

    def pretty_print(self) -> str:
        text = "(prefix cache off)"
        print(text)
        return text
