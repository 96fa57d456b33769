"""A chat's reasoning and tool calls parsed out of its text over HTTP, streamed and not: the
tiny model is made to write them by a grammar."""

import json

import httpx
import pytest

from radixserve import Engine
from radixserve.server import create_app

from .test_server import _serve

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
# the answer the grammar forces: a thought, then one call
EBNF = (
    'root ::= "<think>" [a-z]{1,8} "</think>\\n" "<tool_call>\\n"'
    ' "{\\"name\\": \\"lookup\\", \\"arguments\\": {}}" "\\n</tool_call>"'
)


@pytest.fixture(scope="module")
def url():
    engine = Engine("tiny", page_size=4, reasoning_parser="qwen3")
    srv, thread, url = _serve(create_app(engine, "tiny"))
    yield url
    srv.should_exit = True
    thread.join(timeout=10)


def chat(url: str, stream: bool) -> httpx.Response:
    body = {
        "messages": [{"role": "user", "content": "look it up"}],
        "tools": [TOOL],
        "ebnf": EBNF,
        "max_tokens": 200,
        "temperature": 0,
        "stream": stream,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def test_reasoning_and_calls_are_parsed_streamed_and_not(url):
    whole = chat(url, False).json()["choices"][0]
    message = whole["message"]
    assert message["reasoning_content"].isalpha() and message["content"] is None
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "lookup", "arguments": "{}"}]
    assert whole["finish_reason"] == "tool_calls"
    events = [
        json.loads(line[6:])
        for line in chat(url, True).text.splitlines()
        if line.startswith("data: {")
    ]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == ""
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [(c["index"], c["function"]) for c in calls] == [
        (0, message["tool_calls"][0]["function"])
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
