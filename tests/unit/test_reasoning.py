"""Reasoning split from the answer: whole outputs and the same outputs streamed in any pieces
split the same way, under both conventions."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.chat.reasoning_parsers import REASONING_FORMATS, reasoning_format

QWEN, R1 = REASONING_FORMATS["qwen3"], REASONING_FORMATS["deepseek_r1"]


@pytest.mark.parametrize(
    "fmt, text, reasoning, answer",
    [
        (QWEN, "<think>Paris is in France.</think>\n\nParis.", "Paris is in France.", "Paris."),
        (QWEN, "  <think>a</think>b", "a", "b"),
        (QWEN, "Paris.", None, "Paris."),
        (QWEN, "<think>still thinking", "still thinking", ""),
        (QWEN, "<thin", None, "<thin"),
        (QWEN, "no <think>here</think>", None, "no <think>here</think>"),
        (R1, "It is Paris.</think>Paris.", "It is Paris.", "Paris."),
        (R1, "<think>x</think>y", "x", "y"),
        (R1, "never closed", "never closed", ""),
    ],
)
def test_outputs_split_into_reasoning_and_answer(fmt, text, reasoning, answer):
    assert fmt.split(text) == (reasoning, answer)


@pytest.mark.parametrize("fmt", [QWEN, R1], ids=lambda f: f.name)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_streaming_in_any_pieces_equals_the_whole_split(fmt, data):
    texts = ["<think>a < b </thin k</think>\n\nanswer </think>", "x</think>y", "<think>", "plain"]
    text = data.draw(st.sampled_from(texts))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    stream, thought, answer = fmt.stream(), "", ""
    for piece in pieces:
        t, a = stream.feed(piece)
        thought, answer = thought + t, answer + a
    t, a = stream.finish()
    assert ((thought + t) or None, answer + a) == fmt.split(text)


def test_unknown_parsers_are_refused():
    assert reasoning_format(None) is None
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        reasoning_format("o1")
