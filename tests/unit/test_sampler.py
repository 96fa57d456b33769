import numpy as np
import pytest
import torch

from radixserve.engine.req import Req
from radixserve.engine.runner.sampler import Sampler
from radixserve.engine.sampling_params import SamplingParams

# token 0 most likely, then 1, 2, 3 ...
LOGITS = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])


def draws(params: SamplingParams, n: int = 400, output=()) -> set[int]:
    sampler = Sampler(seed=0)
    reqs = []
    for _ in range(n):
        req = Req("r", np.array([5], np.int32), params)
        req.output_ids = list(output)
        reqs.append(req)
    return set(sampler.sample(LOGITS.repeat(n, 1), reqs))


def test_greedy_takes_the_argmax():
    assert draws(SamplingParams(temperature=0)) == {0}


def test_truncations_limit_the_draws():
    assert draws(SamplingParams(temperature=1.0)) == {0, 1, 2, 3, 4, 5}
    assert draws(SamplingParams(top_k=2)) == {0, 1}
    # p(0) = 0.64, p(1) = 0.24: top_p 0.7 keeps the tokens needed to pass 0.7.
    assert draws(SamplingParams(top_p=0.7)) == {0, 1}
    assert draws(SamplingParams(top_p=0.5)) == {0}
    assert draws(SamplingParams(min_p=0.3)) == {0, 1}  # p(1)/p(0) = e^-1 = 0.37


def test_penalties_move_the_argmax():
    # Token 0 was generated before: a presence penalty of 2 drops it below token 1.
    assert draws(SamplingParams(temperature=0, presence_penalty=2.0), output=[0]) == {1}
    assert draws(SamplingParams(temperature=0, repetition_penalty=2.0), output=[0]) == {1}
    assert draws(SamplingParams(temperature=0, frequency_penalty=0.6), output=[0, 0]) == {1}


def test_seeded_rows_reproduce_whatever_their_batch():
    params = SamplingParams(temperature=1.0, seed=11)
    alone = Sampler(0).sample(LOGITS[None], [Req("a", np.array([1], np.int32), params)])
    mixed_reqs = [Req(str(i), np.array([1], np.int32), SamplingParams()) for i in range(5)]
    mixed_reqs.insert(2, Req("a", np.array([1], np.int32), params))
    mixed = Sampler(99).sample(LOGITS.repeat(6, 1), mixed_reqs)
    assert mixed[2] == alone[0]


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_k": 0},
        {"min_p": 1.5},
        {"max_new_tokens": -1},
        {"n": 0},
        {"stop": [""]},
    ],
)
def test_bad_params(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_draws_follow_the_probabilities():
    n = 20000
    reqs = [Req("r", np.array([5], np.int32), SamplingParams(temperature=1.0)) for _ in range(n)]
    tokens = Sampler(seed=1).sample(LOGITS.repeat(n, 1), reqs)
    freq = np.bincount(tokens, minlength=len(LOGITS)) / n
    # a frequency's standard deviation is below 0.0035 here: 0.015 is over four of them
    assert np.abs(freq - torch.softmax(LOGITS, -1).numpy()).max() < 0.015


@pytest.mark.parametrize("spread", [0.5, 4.0])  # nucleus 1,537 (a full sort) and 12 tokens
def test_top_p_over_a_large_vocabulary_keeps_the_nucleus(spread):
    logits = torch.from_numpy(np.random.default_rng(0).normal(0, spread, 5000)).float()
    probs = torch.softmax(logits, -1).numpy().astype(np.float64)
    order = np.argsort(-probs)
    above = np.cumsum(probs[order]) - probs[order]
    nucleus = set(order[above < 0.5].tolist())
    n = 3000
    reqs = [Req("r", np.array([5], np.int32), SamplingParams(top_p=0.5)) for _ in range(n)]
    drawn = set(Sampler(seed=2).sample(logits.repeat(n, 1), reqs))
    assert drawn <= nucleus
    if len(nucleus) <= 20:
        assert drawn == nucleus
