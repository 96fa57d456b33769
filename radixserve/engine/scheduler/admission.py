"""Holding a prompt back a step to share: a waiting request whose uncached prefix another
prompt is prefilling right now waits for it and then hits the cache, instead of computing
the same tokens beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from radixserve.cache import RadixCache
from radixserve.engine.scheduler.req_cache import ReqCacheManager

if TYPE_CHECKING:
    from radixserve.engine.req import Req

# Hold a waiting request back a step when it shares at least this many not-yet-cached tokens
# with one admitted in the same step.
IN_BATCH_SHARE_MIN_TOKENS = 32


class InBatchPrefixes:
    """The prompts being prefilled (admitted this step, or with chunks still to go), as a
    few short paths of a scratch tree."""

    def __init__(self, req_cache: ReqCacheManager, running: list[Req]) -> None:
        self.req_cache = req_cache
        self.page = req_cache.page
        self.tree = RadixCache(self.page)
        for req in running:
            if req.kv.computed_len < req.seq_len - 1:
                self.add(req)

    def add(self, req: Req) -> None:
        self.tree.insert(req.seq(), np.zeros(req.seq_len, dtype=np.int64), req.namespace)

    def holds_back(self, req: Req) -> bool:
        """Whether ``req`` should wait a step: a prompt being prefilled shares more of its
        prefix than the cache holds (a short prompt shared whole, as the ``n`` samples of
        one request are, waits too)."""
        if not self.req_cache.cache.retains:
            return False
        in_batch, _ = self.tree.peek_prefix(req.seq(), req.namespace)
        cached, _ = self.req_cache.peek(req)
        whole = (req.seq_len - 1) // self.page * self.page
        return in_batch > cached and in_batch - cached >= min(IN_BATCH_SHARE_MIN_TOKENS, whole)
