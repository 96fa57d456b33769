"""What an engine reports about itself and the cache commands beside them: the CPU paths and
weights it runs on, cache and routing statistics, the invariant audit, a flush. Whatever
reads the scheduler's state runs on the loop thread, through its inbox, so it sees the
state between two steps."""

from __future__ import annotations

from radixserve.cpu import CpuProfile
from radixserve.engine.metrics import routing_snapshot


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
            out = self.metrics.snapshot(self.cache, self.scheduler)
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
