"""The scheduler with a fake model, no torch: admission order per policy, LPM aging, chunks on
page boundaries, the in-batch hold, preemption that keeps KV, abort, prefix groups, and the
slot accounting after every step.

The fake model writes ``(token, position)`` into each slot it computes (and copies what a
batch says to copy) and checks that every context slot it reads still holds the right token
at the right position, so a slot handed to two owners, freed too early, copied from the
wrong place or matched to the wrong prefix fails the pass that reads it.
"""

import subprocess
import sys
import time

import numpy as np
import pytest

from radixserve.cache import BlockHashCache, NoPrefixCache, RadixCache
from radixserve.cache.shared_paths import PrefixGroupRule
from radixserve.engine.config import EngineConfig
from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.req import Req, ReqState
from radixserve.engine.sampling_params import SamplingParams
from radixserve.engine.scheduler.batch import ScheduleBatch
from radixserve.engine.scheduler.req_cache import ReqCacheManager
from radixserve.engine.scheduler.scheduler import Scheduler
from radixserve.engine.speculative.drafts import Drafter
from radixserve.memory import KVSlotAllocator

CACHES = {"radix": RadixCache, "block-hash": BlockHashCache, "off": NoPrefixCache}


def next_token(seq: np.ndarray) -> int:
    return int((seq.astype(np.int64) * np.arange(1, len(seq) + 1)).sum() % 997) + 3


class FakeModel:
    def __init__(self) -> None:
        self.kv: dict[int, tuple[int, int]] = {}
        self.batches: list[ScheduleBatch] = []

    def forward(self, batch: ScheduleBatch) -> dict[Req, list[int]]:
        """Greedy: a draft is kept while it is what the model would pick."""
        self.batches.append(batch)
        if batch.kv_copies is not None:  # cached K/V moved before the pass reads it
            for src, dst in zip(*batch.kv_copies, strict=True):
                self.kv[int(dst)] = self.kv[int(src)]
        out = {}
        for w in batch.work:
            seq, slots = np.concatenate([w.req.seq(), np.int32(w.draft)]), w.req.kv.slots
            assert len(slots) >= w.end
            for pos in range(w.start):
                assert self.kv[int(slots[pos])] == (seq[pos], pos), (w.req.rid, pos)
            for pos in range(w.start, w.end):
                self.kv[int(slots[pos])] = (int(seq[pos]), pos)
            if w.samples:
                emitted = []
                for d in (*w.draft, None):
                    emitted.append(next_token(seq[: w.end - len(w.draft) + len(emitted)]))
                    if emitted[-1] != d:
                        break
                out[w.req] = emitted
        return out


def finish_at_length(req: Req) -> None:
    if len(req.output_ids) >= req.params.max_new_tokens:
        req.finish_reason, req.state = "length", ReqState.FINISHED


class Harness:
    def __init__(self, cache: str = "radix", slots: int = 4096, rule=None, **options) -> None:
        options.setdefault("itl_ratio", None)  # the token budget's own rules, unless asked
        self.config = EngineConfig(**options)
        page = self.config.page_size
        self.allocator = KVSlotAllocator(slots, page)
        self.cache = CACHES[cache](page, self.allocator)
        self.metrics = EngineMetrics()
        req_cache = ReqCacheManager(self.cache, self.allocator, self.metrics)
        drafter = None
        if self.config.speculative:
            tokens = self.config.speculative_tokens
            drafter = Drafter(self.cache, tokens, 1 << 20, self.metrics)
        self.scheduler = Scheduler(
            self.config, req_cache, self.metrics, finish_at_length, rule, drafter
        )
        self.model = FakeModel()
        self.finished: list[Req] = []

    def add(self, tokens, max_new_tokens: int = 4, arrival: float | None = None, **params) -> Req:
        req = Req(
            f"r{len(self.scheduler.waiting) + len(self.scheduler.running) + len(self.finished)}",
            np.asarray(tokens, dtype=np.int32),
            SamplingParams(max_new_tokens=max_new_tokens, **params),
        )
        if arrival is not None:
            req.arrival_s = arrival
        self.scheduler.add(req)
        return req

    def step(self) -> ScheduleBatch | None:
        batch = self.scheduler.schedule()
        if batch is not None:
            tokens = self.model.forward(batch)
            self.finished += self.scheduler.process(batch, tokens)
        self.audit()
        return batch

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_work:
                return
            self.step()
        raise AssertionError("the scheduler made no progress")

    def audit(self) -> None:
        # free + cached + held by running requests == capacity; no slot owned twice
        self.cache.check_invariants(self.scheduler.slots_held)


def expected_output(tokens, n: int) -> list[int]:
    seq = list(tokens)
    for _ in range(n):
        seq.append(next_token(np.asarray(seq, dtype=np.int32)))
    return seq[len(tokens) :]


def prompts(rng, shared: int, users: int, own: int) -> list[list[int]]:
    system = rng.integers(3, 900, shared).tolist()
    return [system + rng.integers(3, 900, own).tolist() for _ in range(users)]


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("policy", ["lpm", "fcfs", "dfs-weight", "random"])
def test_every_policy_and_cache_gives_the_model_sound_slots(cache, policy):
    rng = np.random.default_rng(0)
    h = Harness(cache, page_size=4, schedule_policy=policy, chunked_prefill_size=32)
    work = prompts(rng, 40, 6, 9) + prompts(rng, 20, 3, 30)
    reqs = [h.add(p, max_new_tokens=5) for p in work]
    h.run()
    assert [r.output_ids for r in reqs] == [expected_output(p, 5) for p in work]
    assert h.allocator.num_used == h.cache.total_size  # nothing held outside the cache
    if cache != "off":
        assert h.metrics.hit_tokens > 0


@pytest.mark.parametrize("aging", [0.0, 1e6])
def test_lpm_admits_the_longest_cached_prefix_first_unless_aging_lifts_the_cold(aging):
    rng = np.random.default_rng(1)
    warm = prompts(rng, 48, 1, 4)[0]
    h = Harness(page_size=4, max_running_requests=1, lpm_aging_tokens_per_s=aging)
    h.add(warm, max_new_tokens=1)
    h.run()  # the warm prefix is cached now
    now = time.perf_counter()
    cold = h.add(rng.integers(3, 900, 52).tolist(), max_new_tokens=1, arrival=now - 1.0)
    hit = h.add(warm[:48] + [7, 7, 7], max_new_tokens=1, arrival=now)
    batch = h.step()
    # without aging the hit goes first though it came later; with it, a second of waiting
    # outweighs 48 cached tokens
    assert [w.req for w in batch.work] == [hit if aging == 0 else cold]


def test_fcfs_admits_in_arrival_order():
    h = Harness(page_size=4, schedule_policy="fcfs", max_running_requests=1)
    late = h.add(list(range(3, 40)), arrival=2.0)
    early = h.add(list(range(50, 90)), arrival=1.0)
    h.step()
    assert h.scheduler.running == [early]
    h.run()
    assert late.finished


def test_scoring_the_queue_changes_nothing_in_the_cache():
    rng = np.random.default_rng(2)
    h = Harness(page_size=4, max_running_requests=1)
    h.add(prompts(rng, 64, 1, 4)[0], max_new_tokens=100)
    h.step()  # prefilled and cached; it holds the only running place from now on
    lookups, picture = h.cache.stats().lookups, h.cache.pretty_print()
    for p in prompts(rng, 30, 20, 10):  # partial matches that a match would split
        h.add(p, max_new_tokens=1)
    batch = h.step()  # scores all twenty, admits none
    assert batch.decode and len(h.scheduler.waiting) == 20
    assert h.cache.stats().lookups == lookups  # looked at, never matched
    assert h.cache.pretty_print() == picture  # no split, no recency change


def test_middle_chunks_end_on_page_boundaries():
    h = Harness(page_size=16, chunked_prefill_size=40)
    tokens = list(range(3, 203))
    req = h.add(tokens, max_new_tokens=2)
    ends = []
    while not req.finished:
        batch = h.step()
        ends += [w.end for w in batch.work if not batch.decode]
    assert ends == [32, 64, 96, 128, 160, 200]  # 40 tokens a step, cut back to pages
    assert req.output_ids == expected_output(tokens, 2)


def test_a_request_sharing_an_uncached_prefix_waits_a_step_and_hits_it():
    rng = np.random.default_rng(3)
    first, second = prompts(rng, 64, 2, 8)
    h = Harness(page_size=4)
    a, b = h.add(first, max_new_tokens=1), h.add(second, max_new_tokens=1)
    batch = h.step()
    assert [w.req for w in batch.work] == [a]  # b is held back
    h.run()
    assert b.kv.prompt_cached_tokens >= 64 and a.kv.prompt_cached_tokens == 0
    off = Harness("off", page_size=4)
    a, b = off.add(first, max_new_tokens=1), off.add(second, max_new_tokens=1)
    batch = off.step()
    assert {w.req for w in batch.work} == {a, b}  # no cache: nothing to wait for


def test_preemption_keeps_computed_kv_and_changes_no_output():
    rng = np.random.default_rng(4)
    work = [rng.integers(3, 900, 30).tolist() for _ in range(6)]
    h = Harness(page_size=4, slots=160)
    reqs = [h.add(p, max_new_tokens=12) for p in work]
    h.run()
    assert h.metrics.preemptions > 0
    assert [r.output_ids for r in reqs] == [expected_output(p, 12) for p in work]
    # a preempted request resumed from the tree: more was matched than was ever queried
    assert h.cache.stats().hit_tokens > h.metrics.hit_tokens


def test_cached_page_heads_are_copied_so_a_prompt_computes_only_what_is_new():
    rng = np.random.default_rng(6)
    prompt = rng.integers(3, 900, 32).tolist()  # eight whole pages
    h = Harness(page_size=4)
    h.add(prompt, max_new_tokens=3)
    h.run()
    again = [h.add(prompt, max_new_tokens=3) for _ in range(3)] + [h.add(prompt[:30])]
    batch = h.step()
    spans = {w.req: (w.start, w.end) for w in batch.work}
    # the last: 28 tokens in whole pages, token 28 copied from the cached page after them
    assert [spans[r] for r in again] == [(31, 32)] * 3 + [(29, 30)]
    src, dst = batch.kv_copies
    assert len(src) == len(dst) == 3 * 3 + 1 and not set(dst) & set(
        h.cache.match_prefix(np.asarray(prompt, dtype=np.int32)).slots
    )  # into the requests' own pages
    h.run()
    assert [r.output_ids for r in again] == [expected_output(prompt, 3)] * 3 + [
        expected_output(prompt[:30], 4)
    ]
    assert [r.kv.prompt_cached_tokens for r in again] == [31, 31, 31, 29]
    assert h.allocator.num_used == h.cache.total_size


def test_copies_under_preemption_change_no_output():
    rng = np.random.default_rng(7)
    prompt = rng.integers(3, 900, 24).tolist()
    h = Harness(page_size=4, slots=120)
    h.add(prompt, max_new_tokens=2)
    h.run()
    reqs = [h.add(prompt, max_new_tokens=20) for _ in range(5)]
    h.run()
    assert h.metrics.preemptions > 0
    assert [r.output_ids for r in reqs] == [expected_output(prompt, 20)] * 5
    assert any(b.kv_copies is not None for b in h.model.batches)


def echo(rng) -> list[int]:
    """A prompt ending in a token ``a`` whose first output ``b`` follows ``a`` earlier on:
    its first decode step drafts what followed them there."""
    while True:
        a, b = rng.integers(3, 900, 2).tolist()
        prompt = [*rng.integers(3, 900, 6).tolist(), a, b, *rng.integers(3, 900, 9).tolist(), a]
        if next_token(np.asarray(prompt, dtype=np.int32)) == b:
            return prompt


@pytest.mark.parametrize("slots", [4096, 96])
def test_drafts_change_no_output_and_rejected_ones_give_their_slots_back(slots):
    """Questions asked again draft from the tree (all kept); prompts that repeat a block
    draft n-grams (mostly rejected); under tight memory requests are preempted between
    drafted steps. Every step's slots are audited and read back by the fake model."""
    rng = np.random.default_rng(3)
    h = Harness(
        slots=slots, page_size=4, chunked_prefill_size=64, speculative="ngram", speculative_tokens=5
    )
    asked = prompts(rng, 8, 3, 5)
    waves = [asked + [echo(rng)], asked + [echo(rng)], asked]
    reqs = []
    for wave in waves:
        reqs += [(p, h.add(p, max_new_tokens=17)) for p in wave]
        h.run()
    assert [r.output_ids for _, r in reqs] == [expected_output(p, 17) for p, _ in reqs]
    m = h.metrics
    assert m.accepted_tokens["tree"] == m.draft_tokens["tree"] > 0
    assert m.draft_tokens["ngram"] > m.accepted_tokens.get("ngram", 0)
    assert h.allocator.num_used == h.cache.total_size
    assert (m.preemptions > 0) == (slots < 100)


def test_abort_frees_a_running_and_a_waiting_request():
    h = Harness(page_size=4, max_running_requests=1)
    running = h.add(list(range(3, 43)), max_new_tokens=50)
    waiting = h.add(list(range(50, 90)), max_new_tokens=50)
    h.step()
    h.step()
    assert h.scheduler.running == [running] and h.scheduler.waiting == [waiting]
    h.scheduler.abort(running)
    h.scheduler.abort(waiting)
    h.audit()
    assert not h.scheduler.has_work
    assert running.finish_reason == waiting.finish_reason == "abort"
    assert h.allocator.num_used == h.cache.total_size  # its computed prefix stays cached
    h.cache.evict(h.cache.total_size)
    assert h.allocator.num_free == h.allocator.capacity


def test_only_the_groups_the_backend_runs_are_formed_and_counted():
    rng = np.random.default_rng(5)
    work = prompts(rng, 64, 4, 5)
    rule = PrefixGroupRule(min_shared=32, min_group_tokens=3, max_member_tokens=1)
    h = Harness(page_size=4, rule=rule)
    for p in work:
        h.add(p, max_new_tokens=3)
    h.run()
    grouped = [b for b in h.model.batches if b.prefix_groups]
    # extends exceed one token a member: only decodes group, beside extends or not
    assert grouped and all(b.work[i].decode for b in grouped for _, m in b.prefix_groups for i in m)
    for b in grouped:
        for shared, members in b.prefix_groups:
            assert shared >= 32 and len(members) >= 3
    assert h.metrics.cascade_groups == sum(len(b.prefix_groups) for b in grouped)
    none = Harness(page_size=4)
    for p in work:
        none.add(p, max_new_tokens=3)
    none.run()
    assert not any(b.prefix_groups for b in none.model.batches)


def test_the_scheduler_and_its_bookkeeping_need_no_torch():
    code = (
        "import sys, radixserve.engine.scheduler.scheduler, radixserve.engine.scheduler.req_cache, "
        "radixserve.engine.metrics; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
