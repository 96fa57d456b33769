"""Tool-call formats: whole outputs and the same outputs streamed in any pieces parse to the
same content and calls; forced grammars admit exactly valid calls; chats with tools and
earlier calls render as the format writes them."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.chat.templates import tool_messages
from radixserve.chat.tool_parsers import TOOL_FORMATS, ToolCall, tool_format

HERMES, LLAMA = TOOL_FORMATS["hermes"], TOOL_FORMATS["llama3_json"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}

OUTPUTS = [
    ("Hello there.", "Hello there.", []),
    (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n',
        "Let me check.",
        [ToolCall("get_weather", '{"city": "Oslo"}'), ToolCall("get_time", "{}")],
    ),
    ('<tool_call>{"name": "get_time", "arguments": {}}</tool', None, [ToolCall("get_time", "{}")]),
    ("<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after", []),
    ("an unclosed <tool_call> {oops", "an unclosed <tool_call> {oops", []),
    ("a < b <tool and more", "a < b <tool and more", []),
]


@pytest.mark.parametrize("text, content, calls", OUTPUTS)
def test_hermes_outputs_parse_into_content_and_calls(text, content, calls):
    assert HERMES.parse(text) == (content, calls)


def test_llama3_outputs_are_calls_only_when_the_whole_answer_is_json():
    text = '{"name": "get_weather", "parameters": {"city": "a;b"}}; {"name": "get_time"}'
    assert LLAMA.parse(text) == (
        None,
        [ToolCall("get_weather", '{"city": "a;b"}'), ToolCall("get_time", "{}")],
    )
    assert LLAMA.parse('<|python_tag|>{"name": "f", "parameters": {}}')[1] == [ToolCall("f", "{}")]
    assert LLAMA.parse("{not json") == ("{not json", [])
    assert LLAMA.parse("plain text") == ("plain text", [])


@pytest.mark.parametrize("fmt", [HERMES, LLAMA], ids=lambda f: f.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_streaming_in_any_pieces_equals_the_whole_parse(fmt, data):
    calls = [ToolCall("get_weather", '{"city": "Oslo"}'), ToolCall("get_time", "{}")]
    texts = [t for t, _, _ in OUTPUTS] + [fmt.write(calls), " " + fmt.write(calls[:1])]
    text = data.draw(st.sampled_from(texts))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    max_calls = data.draw(st.sampled_from([None, 1]))
    stream, content, got = fmt.stream(max_calls), "", []
    for piece in pieces:
        c, k = stream.feed(piece)
        content, got = content + c, got + k
    c, k = stream.finish()
    content, got = content + c, got + k
    assert ((content if content.strip() else None), got) == fmt.parse(text, max_calls)
    if max_calls == 1:
        assert len(got) <= 1


@pytest.mark.parametrize("fmt", [HERMES, LLAMA], ids=lambda f: f.name)
def test_written_calls_parse_back(fmt):
    calls = [ToolCall("get_weather", '{"city": "Oslo", "days": 2}'), ToolCall("get_time", "{}")]
    assert fmt.parse(fmt.write(calls)) == (None, calls)


@pytest.mark.parametrize("fmt", [HERMES, LLAMA], ids=lambda f: f.name)
def test_forced_grammars_admit_valid_calls_only(fmt):
    xgr = pytest.importorskip("xgrammar")
    tools = [WEATHER, TIME]

    def accepts(text: str, max_calls: int) -> bool:
        grammar = xgr.Grammar.from_ebnf(fmt.grammar(tools, max_calls))
        return xgr.testing._is_grammar_accept_string(grammar, text)

    one = ToolCall("get_weather", '{"city": "Oslo"}')
    two = [one, ToolCall("get_time", "{}")]
    assert accepts(fmt.write([one]), 1)
    assert accepts(fmt.write(two), 2) and not accepts(fmt.write(two), 1)
    assert not accepts(fmt.write([ToolCall("get_weather", '{"days": 2}')]), 1)  # city required
    assert not accepts(fmt.write([ToolCall("get_wether", '{"city": "Oslo"}')]), 1)
    assert not accepts(fmt.write([ToolCall("get_weather", '{"city": 3}')]), 1)
    assert not accepts("Sure! " + fmt.write([one]), 1)


def test_the_format_follows_the_template_unless_named():
    assert tool_format("auto", "{{ '<tool_call>' }}") is HERMES
    assert tool_format("auto", "<|python_tag|>{{ x }}") is LLAMA
    assert tool_format("auto", None) is HERMES
    assert tool_format("llama3_json", "<tool_call>") is LLAMA
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        tool_format("mistral", None)


def test_a_template_without_tools_gets_them_in_the_system_message_and_calls_as_text():
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    out = tool_messages(messages, [WEATHER], HERMES, native=False)
    assert out[0]["role"] == "system" and json.dumps(WEATHER) in out[0]["content"]
    assert HERMES.parse(out[2]["content"])[1] == [ToolCall("get_weather", '{"city": "Oslo"}')]
    assert out[3] == {"role": "user", "content": "<tool_response>\nrain\n</tool_response>"}
    system = [{"role": "system", "content": "Be brief."}, *messages[:1]]
    joined = tool_messages(system, [WEATHER], HERMES, native=False)
    assert joined[0]["content"].startswith("Be brief.\n\n") and len(joined) == 2
    native = tool_messages(messages, [WEATHER], HERMES, native=True)
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert native[2]["role"] == "tool" and len(native) == 3
