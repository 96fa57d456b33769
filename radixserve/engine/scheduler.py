"""Continuous batching over the prefix cache: admission, chunked prefill, decode, preemption.

Each ``schedule()`` returns the work of one forward pass: either an extend batch (unfinished
prefills first, then waiting requests in policy order, within ``chunked_prefill_size`` new
tokens) or a decode batch (one token for every running request). Only slot indices and token
ids pass through here; tensors live in the model runner. A request's slots and its lock in
the cache are the ``ReqCacheManager``'s to change.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from radixserve.cache import RadixCache
from radixserve.cache.shared_paths import PrefixGroupRule
from radixserve.engine.config import EngineConfig
from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.policy import order_waiting
from radixserve.engine.req import Req, ReqState
from radixserve.engine.req_cache import ReqCacheManager, slots_held

# Hold a waiting request back a step when it shares at least this many not-yet-cached tokens
# with one admitted in the same step.
IN_BATCH_SHARE_MIN_TOKENS = 32
LPM_WINDOW = 256


@dataclass(frozen=True)
class Work:
    """One request's part of a forward: compute positions [start, end) of its sequence."""

    req: Req
    start: int
    end: int

    @property
    def reaches_end(self) -> bool:
        return self.end == self.req.seq_len

    @property
    def samples(self) -> bool:
        """Whether this pass's logits give a token: it reaches the end of the sequence of a
        request that wants tokens (``max_new_tokens=0`` only fills the cache)."""
        return self.reaches_end and self.req.params.max_new_tokens > 0


@dataclass(frozen=True)
class ScheduleBatch:
    work: list[Work]
    decode: bool
    # (shared_len, positions in work): requests whose first shared_len slots are one tree path
    prefix_groups: list[tuple[int, list[int]]] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        req_cache: ReqCacheManager,
        metrics: EngineMetrics,
        finish_check: Callable[[Req], None],
        group_rule: PrefixGroupRule | None = None,
    ) -> None:
        """``group_rule``: the prefix groups the attention backend runs (None: none)."""
        self.config = config
        self.req_cache = req_cache
        self.metrics = metrics
        self.page = config.page_size
        self.finish_check = finish_check
        self.group_rule = group_rule
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.rng = random.Random(config.seed)

    # ---- intake --------------------------------------------------------------------------

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def abort(self, req: Req) -> None:
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            self.req_cache.cache_computed(req, release=True)
        req.state = ReqState.FINISHED
        req.finish_reason = req.finish_reason or "abort"

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def dedup_ratio(self) -> float:
        """Context tokens running requests reference / distinct slots holding them (1.0 when
        nothing is shared)."""
        parts = [r.slots[: r.computed_len] for r in self.running if r.computed_len]
        if not parts:
            return 1.0
        referenced = sum(len(p) for p in parts)
        return referenced / len(np.unique(np.concatenate(parts)))

    @property
    def slots_held(self) -> int:
        """Slots running requests own outside the cache (for the cache's invariant check)."""
        return slots_held(self.running)

    # ---- scheduling ----------------------------------------------------------------------

    def schedule(self) -> ScheduleBatch | None:
        extend = self._schedule_extend()
        if extend:
            return ScheduleBatch(extend, decode=False, prefix_groups=self._groups(extend))
        decode = self._schedule_decode()
        if not decode:
            return None
        return ScheduleBatch(decode, decode=True, prefix_groups=self._groups(decode))

    def _groups(self, work: list[Work]) -> list[tuple[int, list[int]]]:
        """The tree paths the batch's requests share, among the groups the attention backend
        runs: it reads each shared prefix once for all its readers."""
        rule = self.group_rule
        if rule is None or len(work) < 2:
            return []
        members = [i for i, w in enumerate(work) if rule.takes_member(w.end - w.start)]
        # A request may lock a longer match than it reads from the tree (prompt logprobs
        # recompute their span): only its first cached_len slots are the tree's.
        found = self.req_cache.cache.shared_prefixes(
            [work[i].req.last_node for i in members],
            [work[i].req.cached_len for i in members],
            rule.min_shared,
        )
        groups = []
        for shared, positions in found:
            group = [members[p] for p in positions]
            if rule.takes_group([work[i].end - work[i].start for i in group]):
                groups.append((shared, group))
        self.metrics.cascade_groups += len(groups)
        self.metrics.cascade_saved_tokens += sum((len(m) - 1) * n for n, m in groups)
        return groups

    def _schedule_extend(self) -> list[Work]:
        budget = self.config.chunked_prefill_size
        work: list[Work] = []
        for req in self.running:  # unfinished chunked prefills go first
            if req.computed_len < req.seq_len - 1 and budget > 0:
                item = self._take_chunk(req, budget)
                if item is None:
                    return work
                work.append(item)
                budget -= item.end - item.start
        if budget <= 0 or not self.waiting:
            return work
        # Scoring looks every candidate up in the tree (read-only); with a long queue only
        # the oldest LPM_WINDOW are considered each step (aging puts them first anyway).
        candidates = self.waiting
        if len(candidates) > LPM_WINDOW:
            candidates = sorted(candidates, key=lambda r: r.arrival_s)[:LPM_WINDOW]
        ordered = order_waiting(
            candidates,
            self.config.schedule_policy,
            self.req_cache.peek,
            self.config.lpm_aging_tokens_per_s,
            self.rng,
        )
        # Prompts being prefilled (admitted this step, or chunks still to go), to spot a later
        # one that would share their uncached prefix: it waits and then hits the cache
        # instead of recomputing it.
        admitted = RadixCache(self.page, native_matcher=False)  # a few short paths
        for req in self.running:
            if req.computed_len < req.seq_len - 1:
                admitted.insert(req.seq(), np.zeros(req.seq_len, dtype=np.int64), req.namespace)
        for req in ordered:
            if budget <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if self._shares_uncached_prefix(req, admitted):
                continue
            admitted.insert(req.seq(), np.zeros(req.seq_len, dtype=np.int64), req.namespace)
            self.req_cache.admit(req)
            self.waiting.remove(req)
            self.running.append(req)
            req.state = ReqState.RUNNING
            item = self._take_chunk(req, budget)
            if item is None:
                break
            work.append(item)
            budget -= item.end - item.start
        return work

    def _shares_uncached_prefix(self, req: Req, admitted: RadixCache) -> bool:
        if not self.req_cache.cache.retains:
            return False
        in_batch, _ = admitted.peek_prefix(req.seq(), req.namespace)
        cached, _ = self.req_cache.peek(req)
        # A short prompt shared whole (the n samples of one request) waits too.
        whole = (req.seq_len - 1) // self.page * self.page
        return in_batch > cached and in_batch - cached >= min(IN_BATCH_SHARE_MIN_TOKENS, whole)

    def _take_chunk(self, req: Req, budget: int) -> Work | None:
        start = req.computed_len
        end = min(req.seq_len, start + budget)
        if end < req.seq_len:  # a middle chunk ends on a page boundary
            end = max(start + self.page, end // self.page * self.page)
        if not self.req_cache.ensure_slots(req, end):
            if start == req.cached_len:  # nothing computed yet: wait for memory
                self._return_to_waiting(req)
            return None
        return Work(req, start, end)

    def _schedule_decode(self) -> list[Work]:
        """One token for every running request, oldest first; when memory runs out, the
        newest request not yet scheduled this step is preempted (possibly the one asking)."""
        work: list[Work] = []
        scheduled: set[Req] = set()
        for req in sorted(self.running, key=lambda r: r.arrival_s):
            if req not in self.running or req.computed_len != req.seq_len - 1:
                continue  # preempted for an older request, or still prefilling
            while not self.req_cache.ensure_slots(req, req.seq_len):
                victim = max(
                    (r for r in self.running if r not in scheduled), key=lambda r: r.arrival_s
                )
                self._preempt(victim)
                if victim is req:
                    break
            else:
                work.append(Work(req, req.seq_len - 1, req.seq_len))
                scheduled.add(req)
        return work

    def _preempt(self, req: Req) -> None:
        """Give a running request's memory back, keeping its computed KV in the tree so it
        resumes by matching instead of recomputing."""
        self.running.remove(req)
        self.req_cache.cache_computed(req, release=True)
        self._return_to_waiting(req)
        self.metrics.preemptions += 1

    def _return_to_waiting(self, req: Req) -> None:
        if req in self.running:
            self.running.remove(req)
            self.req_cache.release(req)
        req.cached_len = req.computed_len = 0
        req.state = ReqState.WAITING
        self.waiting.insert(0, req)

    # ---- results -------------------------------------------------------------------------

    def process(self, batch: ScheduleBatch, next_tokens: dict[Req, int]) -> list[Req]:
        """Advance every request in ``batch``; returns those that finished."""
        finished = []
        for item in batch.work:
            req = item.req
            req.computed_len = item.end
            if not batch.decode:  # requests held back this step hit what was just computed
                self.req_cache.cache_computed(req, release=False)
            if item.samples:
                req.output_ids.append(next_tokens[req])
                self.finish_check(req)
            elif item.reaches_end:  # a prefill-only request is done once its prompt is cached
                req.finish_reason, req.state = "length", ReqState.FINISHED
            if req.finished:
                self.running.remove(req)
                self.req_cache.cache_computed(req, release=True)
                finished.append(req)
        return finished
