"""Drafting and verifying for speculative decoding: the tree's continuations against the
sequences it was given, n-gram drafts, the adaptive draft length, and the distribution that
verification samples from (chi-square against the target's)."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.cache import RadixCache
from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.req import Req
from radixserve.engine.runner.model_runner import Drafted
from radixserve.engine.runner.sampler import Sampler
from radixserve.engine.sampling_params import SamplingParams
from radixserve.engine.speculative.drafts import Drafter, ngram_draft
from radixserve.engine.speculative.verify import verify

seqs = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(seqs, st.integers(1, 4), st.data())
def test_a_continuation_is_what_followed_the_tokens_in_a_cached_sequence(inserted, page, data):
    cache = RadixCache(page)
    stored = []
    for s in inserted:
        cache.insert(s, np.arange(len(s)))
        stored.append(s[: len(s) // page * page])
    base = data.draw(st.sampled_from(inserted))
    query = base[: data.draw(st.integers(0, len(base)))] + data.draw(
        st.lists(st.integers(0, 3), max_size=2)
    )
    limit = data.draw(st.integers(1, 6))
    got = cache.continuation(np.asarray(query, dtype=np.int32), None, limit).tolist()
    n = len(query)
    extending = [s for s in stored if len(s) > n and s[:n] == query]
    if not extending:
        assert got == []
        return
    # read down to a leaf (or the limit) along one of the sequences that go on
    assert any(s[n : n + len(got)] == got and len(got) == min(limit, len(s) - n) for s in extending)


def test_a_continuation_stays_in_its_namespace_and_prefers_the_recent_branch():
    cache = RadixCache(2)
    cache.insert([1, 2, 3, 4, 5, 6], np.arange(6), "a")
    cache.insert([1, 2, 3, 4, 7, 8], np.arange(6), "a")
    assert cache.continuation([1, 2, 3], "a", 3).tolist() == [4, 7, 8]
    assert cache.continuation([1, 2, 3], "b", 3).tolist() == []
    cache.match_prefix([1, 2, 3, 4, 5, 6], "a")  # the other branch used last
    assert cache.continuation([1, 2, 3], "a", 3).tolist() == [4, 5, 6]


def test_an_ngram_draft_follows_the_latest_longest_match():
    seq = np.array([5, 1, 2, 9, 9, 1, 2, 3, 4, 8, 1, 2], dtype=np.int32)
    assert ngram_draft(seq, 3).tolist() == [3, 4, 8]  # (1, 2) last seen before 3
    assert ngram_draft(np.array([7, 8, 9], dtype=np.int32), 4).tolist() == []
    # the longer match wins over a later shorter one
    seq = np.array([4, 1, 2, 6, 0, 1, 2, 7, 4, 1, 2], dtype=np.int32)
    assert ngram_draft(seq, 1).tolist() == [6]


def test_the_draft_length_adapts_and_pauses_after_rejections():
    metrics = EngineMetrics()
    cache = RadixCache(1)
    drafter = Drafter(cache, 4, 1000, metrics)
    cache.insert(list(range(3, 40)), np.arange(37))
    req = Req("r", np.arange(3, 10, dtype=np.int32), SamplingParams(max_new_tokens=50))
    assert drafter.propose(req) == (10, 11, 12, 13)
    drafter.observe(req, 4, 1)
    assert req.draft_state.limit == 2
    assert len(drafter.propose(req)) == 2
    drafter.observe(req, 2, 0)
    drafter.observe(req, 1, 0)  # a second draft in a row with nothing kept: a pause
    assert drafter.propose(req) == ()
    assert len(drafter.propose(req)) == 1
    drafter.observe(req, 1, 1)  # all kept: twice as many next
    assert req.draft_state.limit == 2
    assert metrics.draft_tokens == {"tree": 8} and metrics.accepted_tokens == {"tree": 2}
    # no drafts past max_new_tokens, or under a penalty
    assert drafter.propose(Req("s", req.input_ids, SamplingParams(max_new_tokens=1))) == ()
    penalised = SamplingParams(max_new_tokens=9, repetition_penalty=1.1)
    assert drafter.propose(Req("t", req.input_ids, penalised)) == ()


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    dof = torch.tensor((keep.sum() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(stat / 2, dtype=torch.float64)))


def test_verification_samples_the_targets_distribution():
    """Emitted tokens are distributed as the target's, position after position: the first
    as p0; after an accepted first draft, the second as p1; after both, the bonus as p2."""
    probs = [[1, 1, 4, 1, 2, 1], [2, 1, 1, 1, 5, 0.5], [1, 2, 3, 1, 1, 2]]
    logits = torch.tensor(probs).log()
    draft = (2, 4)
    params = SamplingParams(temperature=0.8, seed=7, max_new_tokens=8)
    sampler = Sampler(0)
    req = Req("r", np.arange(3, dtype=np.int32), params)
    firsts, seconds, thirds = [], [], []
    for _ in range(6000):
        out = verify(Drafted(req, draft, logits), sampler)
        firsts.append(out[0])
        if out[0] == draft[0]:
            seconds.append(out[1])
            if out[1] == draft[1]:
                thirds.append(out[2])
        assert len(out) <= 3 and out[:-1] == list(draft[: len(out) - 1])
    target = torch.softmax(logits / 0.8, dim=-1).numpy().astype(np.float64)
    for row, emitted in enumerate((firsts, seconds, thirds)):
        counts = np.bincount(emitted, minlength=6).astype(np.float64)
        assert counts.sum() > 300
        assert _chi_square_p(counts, target[row]) > 1e-3, (row, counts, target[row])


def test_greedy_verification_keeps_drafts_while_they_are_the_argmax():
    logits = torch.zeros(4, 5)
    logits[0, 1] = logits[1, 2] = logits[2, 0] = logits[3, 4] = 1
    req = Req("r", np.arange(3, dtype=np.int32), SamplingParams(temperature=0))
    assert verify(Drafted(req, (1, 2, 3), logits), Sampler(0)) == [1, 2, 0]
    assert verify(Drafted(req, (1, 2, 0), logits), Sampler(0)) == [1, 2, 0, 4]
    assert verify(Drafted(req, (3, 2, 0), logits), Sampler(0)) == [1]


def test_verification_holds_off_stop_tokens_until_min_new_tokens():
    """Row ``j`` comes after ``j`` draft tokens: EOS (0 here), the argmax at every row, is
    held off at rows before the output reaches ``min_new_tokens``, drafts or not."""
    logits = torch.zeros(4, 5)
    logits[:, 0] = 2
    logits[:, 3] = 1
    params = SamplingParams(temperature=0, max_new_tokens=9, min_new_tokens=3)
    req = Req("r", np.arange(3, dtype=np.int32), params)
    req.output_ids = [4]  # one made: rows 0 and 1 (outputs 2 and 3) may not stop
    sampler = Sampler(0, eos_token_ids=[0])
    assert verify(Drafted(req, (3, 3, 3), logits), sampler) == [3, 3, 0]
    assert sampler.sample(logits[:1], [req]) == [3]
    assert Sampler(0).sample(logits[:1], [req]) == [0]  # no EOS known: nothing to hold
