"""The one owner of a running request's KV slots and of its lock in the prefix cache.

Slot regions of a running request (positions in its sequence, prompt then output):

    [0, cached_len)             the cache's slots, locked through ``last_node``
    [cached_len, computed_len)  computed by this request, in its own whole pages (or, at
                                admission, copied from the cache's page past cached_len)
    [computed_len, len(slots))  taken ahead for the pass being scheduled, not computed yet

``slots`` lists the slot of every position below ``len(slots)``: the cache's first, then the
request's own pages, so a page never mixes the two. ``cache_computed`` offers
``[0, computed_len)`` to the cache and moves the boundary: pages the cache adopts join its
region; pages it already had are freed here and read from the cache's slots instead.
The same calls work for every cache, the null one included (it adopts nothing).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from radixserve.cache import BasePrefixCache
from radixserve.engine.metrics import EngineMetrics
from radixserve.memory import KVSlotAllocator

if TYPE_CHECKING:  # the tier moves tensors; this bookkeeping stays torch-free
    from radixserve.cache.base import CacheHandle
    from radixserve.engine.req import Req
    from radixserve.memory.tiers.disk_tier import DiskTier
    from radixserve.memory.tiers.host_tier import HostTier

_NO_SLOTS = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class TierRead:
    """Pages of a waiting request being read from the lower tiers, from page
    ``start_page``; ``tiers`` names where each one was."""

    start_page: int
    future: Future
    tiers: list[str]


@dataclass(eq=False)
class ReqKV:
    """A request's slots and its lock in the prefix cache (the region map above), and how
    much of its prompt the cache served; written here (the scheduler moves
    ``computed_len`` as passes complete)."""

    slots: np.ndarray = field(default_factory=lambda: _NO_SLOTS.copy())
    cached_len: int = 0
    computed_len: int = 0
    last_node: CacheHandle | None = None
    # (src, dst) slots: the head of a cached page copied into the request's own first page
    # instead of computed, done by its next pass (``admit``)
    page_copy: tuple[np.ndarray, np.ndarray] | None = None
    # a read of its pages from the lower tiers, while one runs (``ready``)
    tier_read: TierRead | None = None
    tiers_checked: bool = False  # the tiers have nothing more for it
    admitted_once: bool = False
    prompt_cached_tokens: int = 0  # prefix hit at first admission (preemption excluded)
    prompt_cached_by_tier: dict[str, int] = field(default_factory=dict)

    @property
    def own_slots(self) -> np.ndarray:
        """The slots this request allocated itself (whole pages)."""
        return self.slots[self.cached_len :]


class ReqCacheManager:
    def __init__(
        self,
        cache: BasePrefixCache,
        allocator: KVSlotAllocator,
        metrics: EngineMetrics,
        tier: HostTier | DiskTier | None = None,
        write_through: bool = False,
    ) -> None:
        """``tier``: the top lower tier (host, over disk or alone, or disk), whose pages
        extend what the cache matches; it is written as pages leave the cache, or with
        ``write_through`` as soon as a request finishes."""
        self.cache = cache
        self.allocator = allocator
        self.metrics = metrics
        self.tier = tier
        self.write_through = write_through
        self.page = cache.page_size

    def peek(self, req: Req) -> tuple[int, object]:
        """The cached length of ``req``'s sequence and its deepest whole node; changes
        nothing (for ordering the waiting queue)."""
        return self.cache.peek_prefix(req.seq(), req.namespace)

    def admit(self, req: Req) -> None:
        """Match ``req``'s sequence and lock the match; its slots start as the cached part.

        The cache's region ends on a page boundary, but what is cached may go on into the
        next page: the match runs into the page holding the token the request must compute
        (a prompt cached whole ends there), or a cached page begins with the tokens after
        the match (a shared prompt ends inside a page). That page's head is then copied into
        the request's own first page by its next pass (``page_copy``) instead of computed.
        """
        t0 = time.perf_counter()
        seq = req.seq()
        hit = self.cache.match_prefix(seq, req.namespace)
        self.metrics.lookup_s.append(time.perf_counter() - t0)
        last = self._last(req)
        before, host = hit.length, 0
        if req.kv.tier_read is not None:
            hit, host = self._install_read(req, hit, self._reach(last))
        # [before, hit.length) came from the lower tiers
        served, slots, owner = self.cache.serving_prefix(seq, hit, last)
        cached = served // self.page * self.page
        self.cache.lock(owner)  # the match and the copy's source page
        req.kv.last_node = owner
        req.kv.cached_len = req.kv.computed_len = cached
        req.kv.slots = np.array(slots[:cached], dtype=np.int64)
        # [cached, served): under a page, so never whole and never adopted uncopied
        if served > cached and self.ensure_slots(req, served):
            req.kv.page_copy = (
                np.array(slots[cached:served], dtype=np.int64),
                req.kv.slots[cached:served],
            )
            req.kv.computed_len = served
        if not req.kv.admitted_once:  # a preempted request's re-admission is not a new query
            req.kv.admitted_once = True
            served = req.kv.prompt_cached_tokens = req.kv.computed_len
            lower = max(0, min(served, hit.length) - before)
            host = min(host, lower)
            disk = lower - host
            req.kv.prompt_cached_by_tier = {"device": served - lower, "host": host, "disk": disk}
            self.metrics.admitted(len(req.input_ids), served)
            self.metrics.host_hit_tokens += host
            self.metrics.disk_hit_tokens += disk

    def ready(self, req: Req) -> bool:
        """Whether ``req`` may be admitted now: not while the lower tiers read pages past
        what the cache matches for it (the read starts here, once per request)."""
        if self.tier is None or req.kv.tiers_checked:
            return True
        if req.kv.tier_read is None:
            reach = self._reach(self._last(req))
            matched, _ = self.peek(req)
            start = matched // self.page
            keys = self.tier.keys(req.seq()[:reach], req.namespace)[start:]
            tiers = self.tier.where(keys)
            if matched >= reach or not tiers:
                req.kv.tiers_checked = True
                return True
            req.kv.tier_read = TierRead(start, self.tier.read_async(keys[: len(tiers)]), tiers)
            return False
        return req.kv.tier_read.future.done()

    def _last(self, req: Req) -> int:
        """How many of ``req``'s first tokens the cache may serve: all but the last (its
        logits give the next one); prompt logprobs from position s need the logits of
        positions s-1 on, so those are computed too."""
        last = req.seq_len - 1
        if req.params.prompt_logprobs:
            last = min(last, max(0, req.params.logprob_start_len - 1))
        return last

    def _reach(self, last: int) -> int:
        """The end of the cached pages a request serving ``last`` tokens can use: up to the
        page holding position ``last`` when part of that page is served (copied)."""
        whole = last // self.page * self.page
        return whole + self.page if whole < last else whole

    def _install_read(self, req: Req, hit, reach: int):
        """Put the pages the tiers read for ``req`` that extend ``hit`` (up to ``reach``)
        into fresh slots and the cache: the longer match and how many of its tokens came
        from host memory; ``hit`` (and 0) when they failed, no longer connect to it (the
        cache lost pages meanwhile), or do not fit."""
        read, req.kv.tier_read = req.kv.tier_read, None
        req.kv.tiers_checked = True
        rows = read.future.result()
        first = hit.length // self.page
        if rows is None or first < read.start_page or hit.length >= reach:
            return hit, 0
        used = slice(first - read.start_page, (reach // self.page) - read.start_page)
        rows = rows[used]
        if not len(rows):
            return hit, 0
        seq, end = req.seq(), hit.length + len(rows) * self.page
        self.cache.lock(hit.node)  # eviction to make room must not take the match
        try:
            needed = self.allocator.slots_needed(end - hit.length)
            if needed > self.allocator.num_free:
                self.cache.evict(needed - self.allocator.num_free)
            if needed > self.allocator.num_free:
                return hit, 0
            fresh = self.allocator.alloc(end - hit.length)
            self.tier.install(fresh, rows)
            done = self.cache.insert(seq[:end], np.concatenate([hit.slots, fresh]), req.namespace)
            self.allocator.free(fresh[: max(0, done.prefix_len - hit.length)])
        finally:
            self.cache.unlock(hit.node)
        host = read.tiers[used].count("host") * self.page
        return self.cache.match_prefix(seq, req.namespace), host

    def ensure_slots(self, req: Req, positions: int, evict: bool = True) -> bool:
        """Make ``req.kv.slots`` cover ``positions`` positions, taking whole pages and evicting
        unlocked cache entries when the pool is short (unless not ``evict``); False (nothing
        changed) if they do not fit."""
        missing = positions - len(req.kv.slots)
        if missing <= 0:
            return True
        needed = self.allocator.slots_needed(missing)
        if needed > self.allocator.num_free and evict:
            self.cache.evict(needed - self.allocator.num_free)
        if needed > self.allocator.num_free:
            return False
        req.kv.slots = np.concatenate([req.kv.slots, self.allocator.alloc(missing)])
        return True

    def trim_slots(self, req: Req, positions: int) -> None:
        """Give back the request's own whole pages past the one holding position
        ``positions - 1`` (taken for draft tokens that were rejected)."""
        keep = max(-(-positions // self.page) * self.page, req.kv.cached_len)
        if len(req.kv.slots) > keep:
            self.allocator.free(req.kv.slots[keep:].copy())
            req.kv.slots = req.kv.slots[:keep]

    def cache_computed(self, req: Req, *, release: bool) -> None:
        """Offer ``[0, computed_len)`` to the cache. Running on (``release=False``): the lock
        moves down to the newly cached end, so requests waiting on this prefix hit it.
        Releasing (finished, aborted, preempted): every slot the cache did not adopt goes
        back to the pool and the lock is dropped."""
        n = req.kv.computed_len
        done = self.cache.insert(req.seq()[:n], req.kv.slots[:n], req.namespace)
        start = req.kv.cached_len
        # [start, prefix_len): pages the cache already had (another request computed them)
        self.allocator.free(req.kv.slots[start : max(start, done.prefix_len)].copy())
        if release:
            if self.write_through and self.tier is not None:
                self.tier.demote(req.seq()[: done.match.length], done.match.slots, req.namespace)
            self.allocator.free(req.kv.slots[max(start, done.match.length) :])
            self.cache.unlock(req.kv.last_node)
            req.kv.slots, req.kv.last_node, req.kv.page_copy = _NO_SLOTS, None, None
            return
        self.cache.lock(done.match.node)
        self.cache.unlock(req.kv.last_node)
        req.kv.slots[: done.match.length] = done.match.slots
        req.kv.cached_len, req.kv.last_node = done.match.length, done.match.node

    def release(self, req: Req) -> None:
        """Drop the lock and free the request's own slots without caching anything (it has
        computed nothing yet)."""
        self.cache.unlock(req.kv.last_node)
        self.allocator.free(req.kv.own_slots)
        req.kv.slots, req.kv.last_node, req.kv.page_copy = _NO_SLOTS, None, None
        req.kv.cached_len = req.kv.computed_len = 0


def slots_held(running: list[Req]) -> int:
    """Slots running requests own outside the cache."""
    return sum(len(r.kv.own_slots) for r in running)
