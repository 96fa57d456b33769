"""Continuous batching over the prefix cache: admission, chunked prefill, decode, preemption.

Each ``schedule()`` returns the work of one forward pass: either an extend batch (unfinished
prefills first, then waiting requests in policy order, within ``chunked_prefill_size`` new
tokens) or a decode batch (one token for every running request). Only slot indices and token
ids pass through here; tensors live in the model runner.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from radixserve.cache import BasePrefixCache, NoPrefixCache, RadixCache
from radixserve.engine.config import EngineConfig
from radixserve.engine.policy import order_waiting
from radixserve.engine.req import Req, ReqState
from radixserve.memory import KVSlotAllocator

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
        cache: BasePrefixCache,
        allocator: KVSlotAllocator,
        finish_check: Callable[[Req], None],
    ) -> None:
        self.config = config
        self.cache = cache
        self.allocator = allocator
        self.page = config.page_size
        self.finish_check = finish_check
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.rng = random.Random(config.seed)
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.requests_admitted = 0
        self.requests_hit = 0
        self.num_preemptions = 0
        self.cascade_min_len: int | None = None  # set when the attention backend groups
        self.cascade_groups = 0  # groups handed to the backend
        self.cascade_saved_tokens = 0  # per layer: K/V rows not re-read thanks to them

    # ---- intake --------------------------------------------------------------------------

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def abort(self, req: Req) -> None:
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            self._cache_and_release(req)
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
        """Slots running requests own outside the tree (for the cache's invariant check)."""
        return sum(len(r.own_slots) for r in self.running)

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
        """The tree paths the batch's requests share, for attention backends that read a
        shared prefix once for all its readers (``cascade_min_len`` None: not asked for)."""
        if self.cascade_min_len is None or len(work) < 2:
            return []
        nodes = [w.req.last_node for w in work]
        # A request may lock a longer match than it reads from the tree (prompt logprobs
        # recompute their span): only its first cached_len slots are the tree's.
        lengths = [w.req.cached_len for w in work]
        groups = self.cache.shared_prefixes(nodes, lengths, self.cascade_min_len)
        self.cascade_groups += len(groups)
        self.cascade_saved_tokens += sum((len(m) - 1) * n for n, m in groups)
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
        # Scoring matches every candidate against the tree; with a long queue only the oldest
        # LPM_WINDOW are considered each step (aging puts them first anyway).
        candidates = self.waiting
        if len(candidates) > LPM_WINDOW:
            candidates = sorted(candidates, key=lambda r: r.arrival_s)[:LPM_WINDOW]
        ordered = order_waiting(
            candidates,
            self.config.schedule_policy,
            self._match_for_policy,
            self.config.lpm_aging_tokens_per_s,
            self.rng,
        )
        # Prompts being prefilled (admitted this step, or chunks still to go), to spot a later
        # one that would share their uncached prefix: it waits and then hits the cache
        # instead of recomputing it.
        admitted = RadixCache(self.page)
        for req in self.running:
            if req.computed_len < req.seq_len - 1:
                admitted.insert(req.seq(), np.zeros(req.seq_len, dtype=np.int64), req.namespace)
        for req in ordered:
            if budget <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if self._shares_uncached_prefix(req, admitted):
                continue
            admitted.insert(req.seq(), np.zeros(req.seq_len, dtype=np.int64), req.namespace)
            self._admit(req)
            item = self._take_chunk(req, budget)
            if item is None:
                break
            work.append(item)
            budget -= item.end - item.start
        return work

    def _match_for_policy(self, req: Req) -> tuple[int, object]:
        hit = self.cache.match_prefix(req.seq(), req.namespace)
        return hit.length, hit.node

    def _shares_uncached_prefix(self, req: Req, admitted: RadixCache) -> bool:
        if isinstance(self.cache, NoPrefixCache):
            return False
        in_batch = admitted.match_prefix(req.seq(), req.namespace).length
        cached = self.cache.match_prefix(req.seq(), req.namespace).length
        # A short prompt shared whole (the n samples of one request) waits too.
        whole = (req.seq_len - 1) // self.page * self.page
        return in_batch > cached and in_batch - cached >= min(IN_BATCH_SHARE_MIN_TOKENS, whole)

    def _admit(self, req: Req) -> None:
        """Lock the request's cached prefix and move it to running."""
        hit = self.cache.match_prefix(req.seq(), req.namespace)
        # At least the last token is computed: its logits give the next one. Prompt
        # logprobs from position s need the logits of positions s-1 on, so those are too.
        last = req.seq_len - 1
        if req.params.prompt_logprobs:
            last = min(last, max(0, req.params.logprob_start_len - 1))
        cached = min(hit.length, last // self.page * self.page)
        self.cache.lock(hit.node)
        req.last_node = hit.node
        req.cached_len = req.computed_len = cached
        req.slots = np.array(hit.slots[:cached], dtype=np.int64)
        if not req.admitted_once:  # preemption recomputes are not new queries
            req.admitted_once = True
            req.prompt_cached_tokens = cached
            self.queried_tokens += len(req.input_ids)
            self.hit_tokens += cached
            self.requests_admitted += 1
            self.requests_hit += cached > 0
        self.waiting.remove(req)
        self.running.append(req)
        req.state = ReqState.RUNNING

    def _take_chunk(self, req: Req, budget: int) -> Work | None:
        start = req.computed_len
        end = min(req.seq_len, start + budget)
        if end < req.seq_len:  # a middle chunk ends on a page boundary
            end = max(start + self.page, end // self.page * self.page)
        if not self._ensure_slots(req, end):
            if start == req.cached_len and req.computed_len == req.cached_len:
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
            while not self._ensure_slots(req, req.seq_len):
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

    def _ensure_slots(self, req: Req, positions: int) -> bool:
        """Make ``req.slots`` cover ``positions`` positions, taking whole pages."""
        missing = positions - len(req.slots)
        if missing <= 0:
            return True
        needed = self.allocator.slots_needed(missing)
        if needed > self.allocator.num_free:
            self.cache.evict(needed - self.allocator.num_free)
        if needed > self.allocator.num_free:
            return False
        req.slots = np.concatenate([req.slots, self.allocator.alloc(missing)])
        return True

    def _preempt(self, req: Req) -> None:
        """Give a running request's memory back, keeping its computed KV in the tree so it
        resumes by matching instead of recomputing."""
        self.running.remove(req)
        self._cache_and_release(req)
        self._return_to_waiting(req)
        self.num_preemptions += 1

    def _return_to_waiting(self, req: Req) -> None:
        if req in self.running:
            self.running.remove(req)
            self.cache.unlock(req.last_node)
            self.allocator.free(req.own_slots)
        req.slots = np.empty(0, dtype=np.int64)
        req.cached_len = req.computed_len = 0
        req.last_node = None
        req.state = ReqState.WAITING
        self.waiting.insert(0, req)

    # ---- results -------------------------------------------------------------------------

    def process(self, batch: ScheduleBatch, next_tokens: dict[Req, int]) -> list[Req]:
        """Advance every request in ``batch``; returns those that finished."""
        finished = []
        for item in batch.work:
            req = item.req
            req.computed_len = item.end
            if not batch.decode:
                self._cache_unfinished(req)
            if item.samples:
                req.output_ids.append(next_tokens[req])
                self.finish_check(req)
            elif item.reaches_end:  # a prefill-only request is done once its prompt is cached
                req.finish_reason, req.state = "length", ReqState.FINISHED
            if req.finished:
                self.running.remove(req)
                self._cache_and_release(req)
                finished.append(req)
        return finished

    def _cache_unfinished(self, req: Req) -> None:
        """After a prefill (or a chunk of one), put what the request computed into the tree
        so requests held back this step hit it; the request moves its lock down to the new
        node and reads the tree's slots wherever the tree already had its own."""
        if isinstance(self.cache, NoPrefixCache):
            return
        n = req.computed_len
        seq = req.seq()[:n]
        already = self.cache.insert(seq, req.slots[:n], req.namespace)
        hit = self.cache.match_prefix(seq, req.namespace)
        self.cache.lock(hit.node)
        self.cache.unlock(req.last_node)
        duplicates = req.slots[req.cached_len : max(req.cached_len, already)].copy()
        req.slots[: hit.length] = hit.slots
        req.cached_len, req.last_node = hit.length, hit.node
        self.allocator.free(duplicates)

    def _cache_and_release(self, req: Req) -> None:
        """Insert the computed part of the sequence into the tree, free what the tree did not
        adopt, and drop the lock on the matched prefix."""
        n = req.computed_len
        already = self.cache.insert(req.seq()[:n], req.slots[:n], req.namespace)
        # Own slots [cached_len, already) duplicate the tree's (or were not adopted at all);
        # [already, aligned) now belong to the tree; [aligned, ...) is the unaligned tail.
        aligned = max(n - n % self.page, already, req.cached_len)
        duplicates = req.slots[req.cached_len : max(req.cached_len, already)]
        self.allocator.free(np.concatenate([duplicates, req.slots[aligned:]]))
        self.cache.unlock(req.last_node)
        req.slots = np.empty(0, dtype=np.int64)
        req.last_node = None
