"""The prefix-cache interface shared by the radix tree, the block-hash index and "cache off".

A prefix cache maps token-id prefixes to the KV slots that hold their keys and values, so a
request whose prompt starts with a cached prefix skips computing it. Matches are exact and
start at position 0 (RoPE bakes absolute positions into K), at page granularity; the radix
tree also finds the cached page whose first tokens continue a match (``match_page_head``),
which the engine copies rather than recomputes.

Ownership of slots: slots inside the cache belong to it and go back to the allocator only
through ``evict`` or ``reset``. A caller that uses cached slots must hold a ``lock`` on the
matched node for as long as it reads them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import TypeAlias

import numpy as np

Namespace = Hashable | None


# An opaque handle to a cached path, handed back to ``lock``/``unlock``: what it is belongs
# to the index (a tree node, a hash block).
CacheHandle: TypeAlias = object


class CacheInvariantError(AssertionError):
    """Raised by ``check_invariants`` when the cache's accounting is inconsistent."""


@dataclass(frozen=True)
class PrefixMatch:
    """The cached part of a query.

    ``length`` is a multiple of the page size; ``slots[i]`` holds token ``i``'s KV for
    ``i < length``; ``node`` is an opaque handle to pass to ``lock``/``unlock``.
    """

    length: int
    slots: np.ndarray
    node: CacheHandle


@dataclass(frozen=True)
class PageHead:
    """The first ``length`` tokens (fewer than a page) of a cached page, held in ``slots``;
    ``node`` owns the page: lock it while the slots are read."""

    length: int
    slots: np.ndarray
    node: object


@dataclass(frozen=True)
class InsertResult:
    """What ``insert`` did to a sequence.

    The cache now holds the sequence's first ``match.length`` tokens (page-aligned; ``match``
    is what ``match_prefix`` would return for them). Of those, ``[0, prefix_len)`` were cached
    before the call: the cache keeps its own slots there and the caller frees the duplicates
    it passed. ``[prefix_len, match.length)`` adopted the caller's slots. Slots from
    ``match.length`` on stay the caller's.
    """

    prefix_len: int
    match: PrefixMatch


@dataclass(frozen=True)
class CacheStats:
    """Counters since the last ``reset``; tokens are counted in prompt tokens queried."""

    lookups: int = 0
    hit_lookups: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    inserted_tokens: int = 0
    evicted_tokens: int = 0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hit_lookups / self.lookups if self.lookups else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            **asdict(self),
            "token_hit_rate": self.token_hit_rate,
            "request_hit_rate": self.request_hit_rate,
        }


class BasePrefixCache(ABC):
    """Contracts every prefix cache keeps.

    Sizes are in tokens. ``evictable_size + protected_size == total_size`` always holds:
    a cached token is protected while any lock covers it and evictable otherwise.
    """

    page_size: int
    # Whether inserted prefixes can be matched later (the null cache's cannot): nothing is
    # gained by holding a request back for a prefix that will not stay cached.
    retains = True

    @abstractmethod
    def match_prefix(
        self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None
    ) -> PrefixMatch:
        """Longest cached page-aligned prefix of ``tokens`` within ``namespace``.

        A page matches only when all its tokens match. May restructure the index (split a
        node at a page boundary) without changing what is cached; refreshes the recency of
        the matched path. The handle is valid until the next eviction unless locked.
        """

    def match_page_head(
        self, tokens: Sequence[int] | np.ndarray, match: PrefixMatch
    ) -> PageHead | None:
        """The cached page after ``match`` (which ``match_prefix(tokens)`` just returned)
        whose first tokens agree longest with the tokens after it; None when none starts
        like them. Copying that head serves what page-granular matching leaves out. An
        index of whole-page hashes cannot tell (the default)."""
        return None

    def continuation(
        self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None, limit: int = 8
    ) -> np.ndarray:
        """Up to ``limit`` token ids that followed ``tokens`` in a cached sequence of
        ``namespace`` (int32; empty when none is cached past them): a speculative decoding
        draft. Changes nothing. An index of whole-page hashes cannot tell (the default)."""
        return np.empty(0, dtype=np.int32)

    def serving_prefix(
        self, tokens: Sequence[int] | np.ndarray, match: PrefixMatch, last: int
    ) -> tuple[int, np.ndarray, object]:
        """How many of the first ``last`` tokens of ``tokens`` the cache can serve given
        ``match`` (which ``match_prefix(tokens)`` just returned), the slots holding them,
        and the node to lock while they are read: the match, into the page holding token
        ``last`` when it runs past it, else on into the head of the next cached page
        (``match_page_head``). What lies past the last whole page is copied by the engine,
        not read in place."""
        if match.length >= last:
            return last, match.slots[:last], match.node
        head = self.match_page_head(tokens, match)
        if head is None:
            return match.length, match.slots, match.node
        n = min(head.length, last - match.length)
        return match.length + n, np.concatenate([match.slots, head.slots[:n]]), head.node

    @abstractmethod
    def peek_prefix(
        self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None
    ) -> tuple[int, object]:
        """``(length, node)``: how many leading tokens ``match_prefix`` would match, and the
        deepest index entry matched whole (an object with a ``parent``, or ``None``).

        Changes nothing: no split, no recency refresh, no counters. For looking at many
        waiting requests each step without disturbing what eviction sees.
        """

    @abstractmethod
    def insert(
        self,
        tokens: Sequence[int] | np.ndarray,
        slots: Sequence[int] | np.ndarray,
        namespace: Namespace = None,
    ) -> InsertResult:
        """Cache the page-aligned part of ``tokens`` whose KV lives in ``slots``; see
        ``InsertResult`` for which slots end up where. Refreshes the path's recency.

        Raises ``ValueError`` with the cache unchanged when ``len(slots) != len(tokens)`` or
        the tokens are not non-negative ints.
        """

    @abstractmethod
    def lock(self, node: CacheHandle) -> None:
        """Protect the path from the root to ``node`` from eviction (reference counted)."""

    @abstractmethod
    def unlock(self, node: CacheHandle) -> None:
        """Undo one ``lock``; raises ``ValueError`` when ``node`` holds no lock."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` cached tokens if that many are evictable.

        Least recently used unlocked leaves go first, their tails before their heads, a
        page at a time; slots return to the allocator. Returns the number of tokens freed
        (may exceed the request by less than a page).
        """

    @property
    @abstractmethod
    def evictable_size(self) -> int:
        """Cached tokens no lock covers."""

    @property
    @abstractmethod
    def protected_size(self) -> int:
        """Cached tokens covered by at least one lock."""

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    @abstractmethod
    def reset(self) -> None:
        """Drop everything cached, returning its slots; refuses while any lock is held."""

    @abstractmethod
    def stats(self) -> CacheStats:
        """Lookup and hit counters since the last reset."""

    @abstractmethod
    def check_invariants(self, slots_held_outside: int = 0) -> None:
        """Verify the accounting; raises ``CacheInvariantError`` on the first violation.

        ``slots_held_outside`` is the number of allocated slots the caller holds outside
        the cache (running requests' own KV), needed to balance the allocator's books.
        """

    def shared_prefixes(
        self, nodes: Sequence[object], lengths: Sequence[int], min_len: int
    ) -> list[tuple[int, list[int]]]:
        """Groups ``(shared_len, positions)`` of ``nodes`` (locked handles, one per running
        request, which reads the first ``lengths[i]`` tokens of its path from the cache) whose
        paths hold the same slots for their first ``shared_len`` tokens, ``shared_len >=
        min_len``; a position is in at most one group. An index that cannot tell cheaply
        returns none, which is always correct."""
        return []

    @abstractmethod
    def pretty_print(self) -> str:
        """Print (and return) a human-readable picture of what is cached."""
