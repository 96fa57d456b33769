"""Mixed steps with the fake model: decodes first and all of them, the token budget counting
decodes, the one-page floor, the share cap between prefills, and the ITL target followed
when a step's time is a known function of its shape (and left aside when nothing
decodes)."""

import numpy as np
import pytest

from radixserve.engine.scheduler.step_budget import StepCostModel, step_features
from tests.unit.test_scheduler import Harness, expected_output


def long_outputs(h: Harness, n: int, rng, max_new_tokens: int = 200) -> list:
    """``n`` requests that are decoding (their prompts computed), oldest first."""
    reqs = [h.add(rng.integers(3, 900, 12).tolist(), max_new_tokens) for _ in range(n)]
    while any(r.kv.computed_len < r.seq_len - 1 or not r.output_ids for r in reqs):
        h.step()
    return reqs


def prefill_tokens(batch) -> int:
    return sum(w.end - w.start for w in batch.work if not w.decode)


def test_every_running_decode_goes_first_and_the_budget_counts_them():
    rng = np.random.default_rng(0)
    h = Harness(page_size=4, chunked_prefill_size=64)
    decoding = long_outputs(h, 20, rng)
    prompt = rng.integers(3, 900, 300).tolist()
    late = h.add(prompt, max_new_tokens=3)
    while not late.output_ids:
        batch = h.step()
        decodes = [w.req for w in batch.work if w.decode]
        assert decodes == [r for r in decoding if r in decodes]  # oldest first, before chunks
        assert set(decodes) == set(decoding)  # nobody stops generating
        assert all(w.decode for w in batch.work[: len(decodes)])
        assert 0 < prefill_tokens(batch) <= 64 - 20
    h.run()
    assert late.output_ids == expected_output(prompt, 3)


def test_a_page_of_prefill_gets_through_when_decodes_fill_the_budget():
    rng = np.random.default_rng(1)
    h = Harness(page_size=4, chunked_prefill_size=8)
    long_outputs(h, 12, rng)
    late = h.add(rng.integers(3, 900, 41).tolist(), max_new_tokens=1)
    steps = 0
    while not late.finished:
        batch = h.step()
        steps += 1
        assert late in [w.req for w in batch.work] and len(batch.work) == 13
    # a page (4 tokens) a step: 40 in ten steps; the last prompt token runs as a decode does
    assert steps == 11


def test_alternating_steps_never_mix():
    rng = np.random.default_rng(2)
    h = Harness(page_size=4, chunked_prefill_size=32, mixed_batches=False)
    long_outputs(h, 4, rng, max_new_tokens=30)
    h.add(rng.integers(3, 900, 100).tolist(), max_new_tokens=2)
    batches = []
    while h.scheduler.has_work:
        batches.append(h.step())
    kinds = [{w.decode for w in b.work} for b in batches]
    assert all(len(k) == 1 for k in kinds) and {True} in kinds and {False} in kinds
    assert h.metrics.mixed_steps == 0


def test_a_long_prompt_takes_half_the_budget_while_short_ones_wait_and_all_of_it_alone():
    rng = np.random.default_rng(3)
    h = Harness(page_size=4, chunked_prefill_size=64)
    long = h.add(rng.integers(3, 900, 400).tolist(), max_new_tokens=2)
    batch = h.step()
    assert prefill_tokens(batch) == 64  # alone: the whole budget
    shorts = [h.add(rng.integers(3, 900, 20).tolist(), max_new_tokens=2) for _ in range(3)]
    batch = h.step()
    chunks = {w.req: w.end - w.start for w in batch.work}
    assert chunks[long] == 32 and shorts[0] in chunks  # capped; the rest went to others
    first = {}
    while h.scheduler.has_work:
        h.step()
        first.update({r: len(first) for r in shorts + [long] if r.output_ids and r not in first})
    assert max(first[r] for r in shorts) < first[long]  # the short ones are not held behind it


def test_what_the_others_leave_goes_back_to_the_capped_chunk():
    rng = np.random.default_rng(4)
    h = Harness(page_size=4, chunked_prefill_size=64, max_running_requests=1)
    long = h.add(rng.integers(3, 900, 400).tolist(), max_new_tokens=2)
    h.step()
    h.add(rng.integers(3, 900, 20).tolist(), max_new_tokens=2)  # cannot run: one at a time
    batch = h.step()
    assert [(w.req, w.end - w.start) for w in batch.work] == [(long, 64)]


FAKE_COEF = np.array([2e-3, 5e-5, 2e-4, 1e-8, 1e-9])


def step_seconds(batch) -> float:
    """The fake machine: a step costs 2 ms, 0.05 ms per prefill token, 0.2 ms per decode row,
    plus attention (1 ms per 100k KV tokens read by decodes, 1 ms per 1M extend pairs)."""
    return float(batch.features() @ FAKE_COEF)


@pytest.mark.parametrize("target_ms", [12.0, 40.0])
def test_the_itl_target_is_followed_when_step_time_is_a_function_of_the_batch(target_ms):
    rng = np.random.default_rng(5)
    h = Harness(page_size=4, chunked_prefill_size=2048, itl_target_ms=target_ms, itl_ratio=None)
    long_outputs(h, 16, rng, max_new_tokens=400)
    times, fitted = [], []
    for _ in range(80):
        while len(h.scheduler.waiting) < 3:  # prompts keep waiting: every step wants prefill
            h.add(rng.integers(3, 900, 300).tolist(), max_new_tokens=2)
        batch = h.step()
        seconds = step_seconds(batch)
        h.scheduler.observe(batch, seconds)
        fitted.append(h.scheduler.itl.model.fitted)
        times.append(seconds)
    warm = [t for t, ok in zip(times, fitted, strict=True) if ok]
    assert len(warm) > 60
    # While only a few batch shapes have been seen, the fit cannot split fixed from per-row
    # cost: a step with one more decode row may overshoot a little. Then it is exact.
    assert max(warm) <= target_ms / 1000 * 1.05
    assert max(warm[20:]) <= target_ms / 1000 * 1.001
    assert np.median(warm) >= target_ms / 1000 * 0.9  # and it fills the step
    assert h.metrics.prefill_budget_tokens > 0


def test_under_the_ratio_a_step_lasts_at_most_twice_its_decodes_and_fills_that():
    rng = np.random.default_rng(8)
    h = Harness(page_size=4, chunked_prefill_size=2048, itl_ratio=2.0)
    decoding = long_outputs(h, 16, rng, max_new_tokens=400)
    for _ in range(3):  # a few decode-only steps: what the decodes alone take
        h.scheduler.observe(batch := h.step(), step_seconds(batch))
    ratios = []
    for _ in range(80):
        while len(h.scheduler.waiting) < 3:
            h.add(rng.integers(3, 900, 300).tolist(), max_new_tokens=2)
        batch = h.step()
        h.scheduler.observe(batch, step_seconds(batch))
        decodes = [w.end for w in batch.work if w.decode]
        assert set(decoding) <= {w.req for w in batch.work}  # nobody stops generating
        if h.scheduler.itl.model.fitted:
            ratios.append(step_seconds(batch) / float(step_features((), decodes) @ FAKE_COEF))
    assert len(ratios) > 60
    assert max(ratios[20:]) <= 2.0 * 1.001
    assert np.median(ratios) >= 2.0 * 0.9  # and prefill takes what the ratio leaves


def test_a_step_without_decodes_takes_the_whole_token_budget_under_a_target():
    rng = np.random.default_rng(9)
    h = Harness(page_size=4, chunked_prefill_size=2048, itl_target_ms=1.0, itl_ratio=None)
    prompt = rng.integers(3, 900, 300).tolist()
    req = h.add(prompt, max_new_tokens=2)
    batch = h.step()  # nobody decodes: no one's latency to protect
    assert prefill_tokens(batch) == 300 and req.output_ids
    h.run()
    assert req.output_ids == expected_output(prompt, 2)


def test_below_a_target_the_decodes_alone_exceed_prefill_still_moves_a_page_a_step():
    rng = np.random.default_rng(6)
    h = Harness(page_size=4, itl_target_ms=1.0, itl_ratio=None)  # 2 ms of fixed cost alone
    long_outputs(h, 4, rng, max_new_tokens=300)
    late = h.add(rng.integers(3, 900, 81).tolist(), max_new_tokens=1)
    steps = 0
    while not late.finished:
        batch = h.step()
        h.scheduler.observe(batch, step_seconds(batch))
        steps += 1
        assert late in [w.req for w in batch.work]
    assert steps <= 21  # one page a step at worst


def test_the_cost_model_recovers_known_coefficients():
    coef = FAKE_COEF
    rng = np.random.default_rng(7)
    model = StepCostModel()
    for _ in range(40):
        ext = [(int(n), int(p)) for n, p in rng.integers(1, 400, (rng.integers(0, 4), 2))]
        ctx = rng.integers(10, 2000, rng.integers(0, 30)).tolist()
        f = step_features(ext, ctx)
        model.observe(f, float(f @ coef))
    assert np.allclose(model.coef, coef, rtol=1e-6, atol=1e-12)
    n = model.max_extend(prefix=500, seconds=0.01)
    spent = float(step_features([(n, 500)], []) @ coef) - coef[0]
    assert spent <= 0.01 < float(step_features([(n + 1, 500)], []) @ coef) - coef[0]
