"""What an engine reports about itself and the cache commands beside them: the CPU paths and
weights it runs on, cache and routing statistics, the invariant audit, a flush. Whatever
reads the scheduler's state runs on the loop thread, through its inbox, so it sees the
state between two steps."""

from __future__ import annotations

import numpy as np

from radixserve.cache import BasePrefixCache, RadixCache
from radixserve.cache.digest import tree_digest
from radixserve.cpu import CpuProfile
from radixserve.engine import compute_thread
from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.req import Req
from radixserve.engine.scheduler.scheduler import Scheduler


class EngineReports:
    """For ``Engine``: needs its ``runner``, ``config``, ``_inbox``, ``metrics``, ``cache``,
    ``scheduler`` and ``tier``."""

    def flush_cache(self) -> bool:
        """Drop everything cached; refused (False) while requests are running."""

        def flush() -> bool:
            if self.scheduler.has_work:
                return False
            self.cache.reset()
            self.metrics.lookup_s.clear()
            return True

        return self._inbox.call(flush)

    @property
    def cpu_profile(self) -> CpuProfile | None:
        """The CPU paths this engine's model runs on (None on a GPU)."""
        return self.runner.cpu_profile

    @property
    def weights(self) -> dict:
        """The model's weights as served (float dtype, bytes, tensors kept quantized by
        format) and as the file stored them (tensors by format)."""
        return self.runner.loaded.weights()

    def cache_stats(self) -> dict:
        """Prefix-cache and serving metrics, read on the scheduler thread."""

        def stats() -> dict:
            out = stats_snapshot(self.metrics, self.cache, self.scheduler)
            if self.tier is not None:
                out |= self.tier.snapshot()
            return out

        return self._inbox.call(stats)

    def routing_stats(self, max_keys: int = 8192) -> dict:
        """What a router across replicas weighs: a digest of the tree (``cache.digest``; no
        keys without a radix cache) and the work queued, in tokens and requests."""

        fingerprint = self.config.routing_fingerprint
        return self._inbox.call(
            lambda: routing_snapshot(self.cache, self.scheduler, fingerprint, max_keys)
        )

    def check_invariants(self) -> None:
        """Audit the cache and slot accounting (from any thread; waits for the loop)."""
        self._inbox.call(lambda: self.cache.check_invariants(self.scheduler.slots_held))


def stats_snapshot(metrics: EngineMetrics, cache: BasePrefixCache, scheduler: Scheduler) -> dict:
    """Every figure, with what the cache holds and the scheduler runs right now (taken on
    the scheduler thread)."""
    alloc = scheduler.req_cache.allocator
    return metrics.figures() | {
        "cached_tokens": cache.total_size,
        "evictable_tokens": cache.evictable_size,
        "protected_tokens": cache.protected_size,
        "kv_capacity": alloc.capacity,
        "kv_used": alloc.num_used,
        "kv_usage": alloc.num_used / alloc.capacity,
        "memory_dedup_ratio": dedup_ratio(scheduler.running),
        "running": len(scheduler.running),
        "waiting": len(scheduler.waiting),
        "compute_threads": compute_thread.team_size(),
    }


def routing_snapshot(
    cache: BasePrefixCache, scheduler: Scheduler, fingerprint: str, max_keys: int
) -> dict:
    """What a router across replicas weighs (taken on the scheduler thread): a digest of
    the tree (no keys without a radix cache) and the work queued, in tokens and requests."""
    waiting, running = scheduler.waiting, scheduler.running
    digest = {"keys": [], "stride": 1, "page_size": cache.page_size}
    if isinstance(cache, RadixCache):
        digest = tree_digest(cache, fingerprint, max_keys).to_dict()
    return digest | {
        "fingerprint": fingerprint,
        "queued_tokens": sum(r.seq_len - r.kv.computed_len for r in waiting + running),
        "running": len(running),
        "waiting": len(waiting),
    }


def dedup_ratio(running: list[Req]) -> float:
    """Context tokens running requests reference / distinct slots holding them (1.0 when
    nothing is shared)."""
    parts = [r.kv.slots[: r.kv.computed_len] for r in running if r.kv.computed_len]
    if not parts:
        return 1.0
    referenced = sum(len(p) for p in parts)
    return referenced / len(np.unique(np.concatenate(parts)))
