"""Continuous batching over the prefix cache: admission, chunked prefill, decode, preemption.

Each ``schedule()`` returns the work of one forward pass. Mixed (the default): one token for
every running request, then prefill chunks (unfinished chunked prefills first, then waiting
requests in policy order) within ``chunked_prefill_size`` tokens, decodes counted, so no
running request stops generating while prompts prefill. Alternating
(``mixed_batches=False``): a prefill pass when anything is to prefill, a decode pass
otherwise. Under an ITL target (by default ``itl_ratio``: a step that prefills beside decodes
lasts at most twice what they alone take) the prefill part is sized to it by a cost model of
the step (``step_budget``). Only slot indices and token ids pass through here; tensors live
in the model runner. A request's slots and its lock in the cache are the
``ReqCacheManager``'s to change.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from radixserve.cache.shared_paths import PrefixGroupRule
from radixserve.engine.config import EngineConfig
from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.req import Req, ReqState
from radixserve.engine.scheduler.admission import InBatchPrefixes
from radixserve.engine.scheduler.batch import ScheduleBatch, Work, prefix_groups, take_copies
from radixserve.engine.scheduler.policy import order_waiting
from radixserve.engine.scheduler.req_cache import ReqCacheManager, slots_held
from radixserve.engine.scheduler.step_budget import ItlBudget, PrefillBudget
from radixserve.engine.speculative.drafts import Drafter

# While other prompts wait, one request's chunk takes at most this share of a step's
# prefill allowance, so one long prompt does not hold every short one behind it; what the
# others leave unused goes back to it.
MAX_PREFILL_SHARE = 0.5


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        req_cache: ReqCacheManager,
        metrics: EngineMetrics,
        finish_check: Callable[[Req], None],
        group_rule: PrefixGroupRule | None = None,
        drafter: Drafter | None = None,
        jump_forward: Callable[[Req], list[int]] | None = None,
    ) -> None:
        """``finish_check``: after new tokens, finishes the request if it is done;
        ``group_rule``: the prefix groups the attention backend runs (None: none);
        ``drafter``: draft tokens for decoding requests (None: no speculative decoding);
        ``jump_forward``: after a sampled token, the tokens its grammar forces next (it may
        finish the request instead, when the grammar rejects the token)."""
        self.config = config
        self.drafter = drafter
        self.req_cache = req_cache
        self.metrics = metrics
        self.page = config.page_size
        self.finish_check = finish_check
        self.jump_forward = jump_forward
        self.group_rule = group_rule
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.rng = random.Random(config.seed)
        self.itl: ItlBudget | None = None
        if config.itl_target_ms is not None or config.itl_ratio is not None:
            target_s = None if config.itl_target_ms is None else config.itl_target_ms / 1000
            self.itl = ItlBudget(self.page, config.chunked_prefill_size, target_s, config.itl_ratio)

    # ---- intake --------------------------------------------------------------------------

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def abort(self, req: Req, reason: str = "abort") -> None:
        """Finish ``req`` now (``abort`` or ``error: ...``), keeping what it computed."""
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            self.req_cache.cache_computed(req, release=True)
        req.finish(reason)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def slots_held(self) -> int:
        """Slots running requests own outside the cache (for the cache's invariant check)."""
        return slots_held(self.running)

    # ---- scheduling ----------------------------------------------------------------------

    def schedule(self) -> ScheduleBatch | None:
        work, budget = self._plan()
        while not work and self.running:
            # Every running request waits on memory the others hold (chunks still to
            # compute, none decoding to preempt for): the newest gives its memory back.
            self._preempt(max(self.running, key=lambda r: r.arrival_s))
            work, budget = self._plan()
        if not work:
            return None
        decodes = sum(w.decode for w in work)
        prefill = budget.initial if decodes < len(work) else 0
        if prefill:
            self.metrics.prefill_budget_tokens = prefill
            self.metrics.mixed_steps += decodes > 0
        groups = prefix_groups(work, self.group_rule, self.req_cache.cache, self.metrics)
        return ScheduleBatch(work, groups, take_copies(work))

    def _plan(self) -> tuple[list[Work], PrefillBudget | None]:
        """The step's work, and the prefill budget it was planned under (None: decodes
        only, which need none, so their steps pay no cost-model fit)."""
        if self.config.mixed_batches:
            decode = self._schedule_decode()
            if not self._prefills_wait():
                return decode, None
            budget = self._budget(decode)
            work = decode + self._schedule_extend(budget)
        else:
            budget = self._budget([])
            work = self._schedule_extend(budget) or self._schedule_decode()
        return work, budget

    def observe(self, batch: ScheduleBatch, seconds: float) -> None:
        """A step's measured length (scheduling to results), for the ITL target's model."""
        if self.itl is not None:
            self.itl.observe(batch.features(), seconds)

    def _prefills_wait(self) -> bool:
        return bool(self.waiting) or any(r.kv.computed_len < r.seq_len - 1 for r in self.running)

    def _budget(self, decode: list[Work]) -> PrefillBudget:
        tokens = self.config.chunked_prefill_size - sum(w.end - w.start for w in decode)
        if self.itl is None:
            return PrefillBudget(tokens, self.page)
        return self.itl.budget(tokens, [w.end for w in decode])

    def _schedule_extend(self, budget: PrefillBudget) -> list[Work]:
        work: list[Work] = []
        capped: list[int] = []  # positions in work of chunks cut to their share

        def take(req: Req, others_wait: bool) -> bool:
            """Schedule ``req``'s next chunk; False when memory ran out."""
            limit = budget.allow(req.kv.computed_len)
            share = max(self.page, int(MAX_PREFILL_SHARE * budget.initial))
            cut = others_wait and limit > share
            end = self._chunk_end(req, share if cut else limit)
            if end is None:
                return True
            item = self._reserve(req, end)
            if item is None:
                return False
            budget.take(item.end - item.start, item.start)
            if cut:
                capped.append(len(work))
            work.append(item)
            return True

        prefilling = [r for r in self.running if r.kv.computed_len < r.seq_len - 1]
        for i, req in enumerate(prefilling):  # unfinished chunked prefills go first
            if budget.exhausted:
                break
            if not take(req, bool(self.waiting) or i + 1 < len(prefilling)):
                return self._give_back(work, capped, budget)
        if not budget.exhausted and self.waiting:
            self._admit(budget, take)
        return self._give_back(work, capped, budget)

    def _admit(self, budget: PrefillBudget, take: Callable[[Req, bool], bool]) -> None:
        c = self.config
        aging = c.lpm_aging_tokens_per_s
        ordered = order_waiting(
            self.waiting, c.schedule_policy, self.req_cache.peek, aging, self.rng
        )
        held = InBatchPrefixes(self.req_cache, self.running)
        for i, req in enumerate(ordered):
            if budget.exhausted or len(self.running) >= self.config.max_running_requests:
                break
            if not self.req_cache.ready(req) or held.holds_back(req):
                continue  # its pages are being read from disk, or it waits to share
            held.add(req)
            self.req_cache.admit(req)
            self.waiting.remove(req)
            self.running.append(req)
            req.state = ReqState.RUNNING
            if not take(req, i + 1 < len(ordered)):
                break

    def _give_back(self, work: list[Work], capped: list[int], budget: PrefillBudget) -> list[Work]:
        """Chunks cut to their share take what the others left of the allowance."""
        for i in capped:
            item = work[i]
            extra = budget.allow(item.end)
            end = self._chunk_end(item.req, item.end - item.start + extra, item.start)
            if extra <= 0 or end is None or end <= item.end:
                continue
            if not self.req_cache.ensure_slots(item.req, end):
                break
            budget.take(end - item.end, item.end)
            work[i] = Work(item.req, item.start, end)
        return work

    def _chunk_end(self, req: Req, limit: int, start: int | None = None) -> int | None:
        """Where a chunk of at most ``limit`` tokens from ``start`` (the computed length)
        ends: at the sequence's end, or a middle chunk on a page boundary; None when not
        even a page fits."""
        start = req.kv.computed_len if start is None else start
        end = min(req.seq_len, start + limit)
        if end < req.seq_len:
            end = end // self.page * self.page
        return end if end > start else None

    def _reserve(self, req: Req, end: int) -> Work | None:
        """Slots for the chunk up to ``end``; None when memory ran out (a request that has
        computed nothing yet goes back to waiting)."""
        start = req.kv.computed_len
        if not self.req_cache.ensure_slots(req, end):
            if start == req.kv.cached_len or req.kv.page_copy is not None:  # nothing computed yet
                self._return_to_waiting(req)  # wait for memory
            return None
        return Work(req, start, end)

    def _schedule_decode(self) -> list[Work]:
        """One token for every running request, oldest first; when memory runs out, the
        newest request not yet scheduled this step is preempted (possibly the one asking)."""
        work: list[Work] = []
        scheduled: set[Req] = set()
        for req in sorted(self.running, key=lambda r: r.arrival_s):
            if req not in self.running or req.kv.computed_len != req.seq_len - 1:
                continue  # preempted for an older request, or still prefilling
            while not self.req_cache.ensure_slots(req, req.seq_len):
                victim = max(
                    (r for r in self.running if r not in scheduled), key=lambda r: r.arrival_s
                )
                self._preempt(victim)
                if victim is req:
                    break
            else:
                work.append(self._decode_work(req))
                scheduled.add(req)
        return work

    def _decode_work(self, req: Req) -> Work:
        """The request's next token, and the drafts it verifies beside it where slots for
        them are free (a draft evicts nothing from the cache and preempts no one)."""
        draft = () if self.drafter is None else self.drafter.propose(req)
        if draft and not self.req_cache.ensure_slots(req, req.seq_len + len(draft), evict=False):
            draft = ()
        return Work(req, req.seq_len - 1, req.seq_len + len(draft), decode=True, draft=draft)

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
        req.kv.cached_len = req.kv.computed_len = 0
        req.state = ReqState.WAITING
        self.waiting.insert(0, req)

    # ---- results -------------------------------------------------------------------------

    def process(self, batch: ScheduleBatch, next_tokens: dict[Req, list[int]]) -> list[Req]:
        """Advance every request in ``batch`` by its new tokens (one, or a verified draft's
        accepted tokens and the one after them); returns those that finished."""
        finished = []
        for item in batch.work:
            req = item.req
            req.kv.computed_len = item.end
            if not item.decode:  # requests held back this step hit what was just computed
                self.req_cache.cache_computed(req, release=False)
            if item.draft:
                self._accept(item, next_tokens[req])
            elif item.samples:
                self._append(req, next_tokens[req][0])
            elif item.reaches_end:  # a prefill-only request is done once its prompt is cached
                req.finish("length")
            if req.finished:
                self.running.remove(req)
                self.req_cache.cache_computed(req, release=True)
                finished.append(req)
        return finished

    def _accept(self, item: Work, tokens: list[int]) -> None:
        """Append a verified draft's tokens until one finishes the request, or its grammar
        forces tokens after one (the tokens after it were verified without them). K/V is
        computed for the last token and the accepted drafts; the rejected drafts' pages go
        back."""
        req = item.req
        taken = 0
        for token in tokens:
            taken += 1
            if self._append(req, token) or req.finished:
                break
        req.kv.computed_len = min(item.start + taken, req.seq_len)
        self.drafter.observe(req, len(item.draft), taken - 1)
        if not req.finished:
            self.req_cache.trim_slots(req, req.seq_len)

    def _append(self, req: Req, token: int) -> bool:
        """Append a sampled token and the tokens its grammar forces after it (jump-forward:
        the next step computes them as one chunk), then see whether the request is done;
        whether any were forced."""
        req.output_ids.append(token)
        forced = [] if self.jump_forward is None else self.jump_forward(req)
        if req.finished:  # the grammar rejected the token
            return False
        req.output_ids.extend(forced)
        self.finish_check(req)
        return bool(forced)
