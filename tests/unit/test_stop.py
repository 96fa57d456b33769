"""The finish check and the incremental detokenizer: the text built token by token equals
one decode of the whole output, stop strings cut at their first occurrence, and the work
per step does not grow with the output."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.chat.held_back import stable_text
from radixserve.engine.req import Req
from radixserve.engine.sampling_params import SamplingParams
from radixserve.engine.stop import StopChecker, first_stop
from radixserve.model.tokenizer import build_tokenizer

TOKENIZER = build_tokenizer()
EOS = TOKENIZER.convert_tokens_to_ids("<|im_end|>")


class CountingTokenizer:
    """Counts the token ids passed to ``decode``."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, **kwargs):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **kwargs)


def generate(ids, params, tokenizer=TOKENIZER) -> Req:
    """Feed ``ids`` one by one as the scheduler does, then finish as the engine does."""
    checker = StopChecker(tokenizer, [EOS], context_len=10**6)
    req = Req("r", np.array([1], np.int32), params)
    for token in ids:
        req.output_ids.append(token)
        checker.check(req)
        if req.finished:
            break
    checker.finalize(req)
    return req


# ids of the preset's byte-level vocabulary, specials excluded, so that byte fragments of
# multi-byte characters come up
ids_strategy = st.lists(st.integers(3, TOKENIZER.vocab_size - 1), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(ids_strategy)
def test_incremental_text_equals_one_decode_of_the_whole_output(ids):
    params = SamplingParams(max_new_tokens=10**6, ignore_eos=True)
    req = generate(ids, params)
    assert req.text == TOKENIZER.decode(ids, skip_special_tokens=True)


def test_multibyte_characters_arrive_whole():
    ids = TOKENIZER("naïve café ☃ done", add_special_tokens=False)["input_ids"]
    checker = StopChecker(TOKENIZER, [EOS], 10**6)
    req = Req("r", np.array([1], np.int32), SamplingParams(max_new_tokens=100))
    seen = []
    for token in ids:
        req.output_ids.append(token)
        checker.check(req)
        seen.append(req.text)
    assert all("\ufffd" not in text for text in seen)
    assert seen[-1] == "naïve café ☃ done"


@settings(max_examples=60, deadline=None)
@given(ids_strategy, st.integers(0, 10**6))
def test_a_stop_string_cuts_at_its_first_occurrence(ids, pick):
    full = TOKENIZER.decode(ids, skip_special_tokens=True)
    if len(full) < 2:
        return
    at = pick % (len(full) - 1)
    stop = full[at : at + 2]
    if "\ufffd" in stop:  # stands for bytes no character completes yet: no one stops on it
        return
    req = generate(ids, SamplingParams(max_new_tokens=10**6, stop=[stop], ignore_eos=True))
    assert req.finish_reason == "stop" and req.matched_stop == stop
    assert req.text == full[: full.find(stop)]


def test_eos_and_length_finish():
    ids = TOKENIZER("one two three four", add_special_tokens=False)["input_ids"]
    req = generate([*ids[:2], EOS, *ids[2:]], SamplingParams(max_new_tokens=100))
    assert (req.finish_reason, req.matched_stop) == ("stop", EOS)
    assert req.text == TOKENIZER.decode(ids[:2])
    req = generate(ids, SamplingParams(max_new_tokens=2))
    assert req.finish_reason == "length" and req.output_ids == ids[:2]


@pytest.mark.parametrize("stop", [None, ["never appears in the text at all"]])
def test_each_step_decodes_only_the_newest_tokens(stop):
    ids = TOKENIZER(" ".join(["the tree of a long word"] * 80), add_special_tokens=False)[
        "input_ids"
    ]
    counting = CountingTokenizer(TOKENIZER)
    req = generate(ids, SamplingParams(max_new_tokens=10**6, stop=stop), counting)
    assert req.text == TOKENIZER.decode(ids)
    # a window of a few tokens per step, not the whole output (that would be ~n^2/2)
    assert counting.decoded <= 6 * len(ids), (counting.decoded, len(ids))


def test_stable_text_holds_back_a_possible_stop():
    assert stable_text("hello wor", ("world",)) == "hello "
    assert stable_text("hello", ("xyz",)) == "hello"
    assert stable_text("a b", ("b c", "zz")) == "a "


def test_first_stop_searches_only_where_new_text_can_complete_one():
    assert first_stop("abcabc", ("bc",)) == (1, "bc")
    assert first_stop("abcabc", ("bc",), new_from=3) == (4, "bc")
    assert first_stop("abcab", ("ca", "b"), new_from=0) == (1, "b")
