"""``logit_bias`` through the engine: a token biased by -100 is never sampled, one biased by
+100 always is, and logprobs report the biased distribution."""

from collections import Counter

import pytest

from radixserve.engine import Engine, SamplingParams

PROMPTS = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]


@pytest.fixture(scope="module")
def engine():
    with Engine("tiny", page_size=4, check_invariants=True) as e:
        yield e


def sampled(engine: Engine, bias: dict[int, float] | None, logprobs: bool = False) -> list[dict]:
    """1,002 tokens sampled at temperature 1 over three prompts."""
    params = SamplingParams(
        max_new_tokens=334,
        temperature=1.0,
        seed=3,
        ignore_eos=True,
        logit_bias=bias,
        return_logprob=logprobs,
    )
    return engine.generate(input_ids=PROMPTS, sampling_params=params)


def test_a_token_biased_by_minus_100_is_never_sampled(engine):
    counts = Counter(t for out in sampled(engine, None) for t in out["token_ids"])
    favourite, times = counts.most_common(1)[0]
    assert times >= 5  # unbiased, it is drawn often
    banned = Counter(t for out in sampled(engine, {favourite: -100}) for t in out["token_ids"])
    assert sum(banned.values()) == 1002 and banned[favourite] == 0


def test_a_token_biased_by_plus_100_is_always_sampled_and_its_logprob_says_so(engine):
    outs = sampled(engine, {42: 100}, logprobs=True)
    assert all(t == 42 for out in outs for t in out["token_ids"])
    for out in outs:
        for logprob, token in out["meta_info"]["output_token_logprobs"]:
            assert token == 42 and logprob > -1e-3


def test_greedy_follows_the_bias_and_other_requests_do_not_see_it(engine):
    plain = SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True)
    alone = engine.generate(input_ids=PROMPTS[0], sampling_params=plain)["token_ids"]
    token = next(t for t in range(100, 200) if t not in alone)
    biased = SamplingParams(
        max_new_tokens=8, temperature=0, ignore_eos=True, logit_bias={token: 50}
    )
    outs = engine.generate(input_ids=[PROMPTS[0]] * 2, sampling_params=[plain, biased])
    assert outs[0]["token_ids"] == alone
    assert outs[1]["token_ids"] == [token] * 8


@pytest.mark.parametrize(
    "bias, message",
    [
        ({1: 101}, r"\[-100, 100\]"),
        ({-1: 1}, "token ids"),
        ({"1": 1}, "token ids"),
        ([(1, 2)], "map token ids"),
    ],
)
def test_bad_biases_are_refused(bias, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(logit_bias=bias)


def test_a_bias_outside_the_vocabulary_is_refused_before_queueing(engine):
    with pytest.raises(ValueError, match="logit_bias token ids"):
        engine.generate(input_ids=[5], sampling_params=SamplingParams(logit_bias={10**6: 1}))
