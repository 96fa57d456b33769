"""Structured output over HTTP: OpenAI's ``response_format`` through the official client,
vLLM's ``structured_outputs`` and SGLang's top-level fields, streamed and not; bad grammars
and conflicting fields get a 400 naming them, and the server keeps serving."""

import json
import re

import httpx
import jsonschema
import openai
import pytest

from radixserve import Engine
from radixserve.server import create_app
from tests.e2e.test_server import _serve

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "rank": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["city", "rank"],
}
MESSAGES = [{"role": "user", "content": "Give me a city and its rank."}]


@pytest.fixture(scope="module")
def server():
    engine = Engine("tiny", page_size=4, check_invariants=True)
    srv, thread, url = _serve(create_app(engine, "tiny"))
    yield url
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def schema_format(schema=SCHEMA):
    return {"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}}


def test_chat_response_format_json_schema_round_trip(server):
    reply = client(server).chat.completions.create(
        model="tiny", messages=MESSAGES, response_format=schema_format(), n=3, seed=1
    )
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_chat_response_format_json_object_streamed(server):
    stream = client(server).chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        response_format={"type": "json_object"},
        stream=True,
        max_tokens=200,
        temperature=0,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert isinstance(json.loads(text), dict)


def test_completions_take_the_same_response_format(server):
    reply = client(server).completions.create(  # the client has no such argument here
        model="tiny", prompt="City:", max_tokens=60, extra_body={"response_format": schema_format()}
    )
    jsonschema.validate(json.loads(reply.choices[0].text), SCHEMA)


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"structured_outputs": {"regex": r"[A-Z]{3}-\d{2}"}}, r"[A-Z]{3}-\d{2}"),
        ({"structured_outputs": {"choice": ["north", "south"]}}, r"north|south"),
        ({"structured_outputs": {"grammar": 'root ::= "x" [0-9]'}}, r"x[0-9]"),
        ({"structured_outputs": {"json": SCHEMA}}, None),
        ({"regex": r"\d{4}"}, r"\d{4}"),
        ({"json_schema": json.dumps(SCHEMA)}, None),
        ({"ebnf": 'root ::= ("ab" | "cd")+ "."'}, r"(ab|cd)+\."),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_vllm_and_sglang_fields_constrain_the_output(server, extra, check, stream):
    body = {"messages": MESSAGES, "max_tokens": 80, "seed": 3, "stream": stream, **extra}
    if stream:
        with httpx.stream("POST", server + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines() if line[6:7] == "{"]
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    else:
        r = httpx.post(server + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["message"]["content"]
    if check is None:
        jsonschema.validate(json.loads(text), SCHEMA)
    else:
        assert re.fullmatch(check, text), text


def test_native_generate_takes_grammar_sampling_params(server):
    body = {"text": "Code:", "sampling_params": {"max_new_tokens": 20, "regex": "[a-f]{6}"}}
    r = httpx.post(server + "/generate", json=body)
    assert r.status_code == 200, r.text
    assert re.fullmatch("[a-f]{6}", r.json()["text"])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"structured_outputs": {"regex": "a(b"}}, "regex does not compile"),
        ({"response_format": schema_format({"type": "nope"})}, "json_schema does not compile"),
        ({"ebnf": "root ::= ("}, "ebnf does not compile"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "not regex, ebnf"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "whitespace_pattern"),
        ({"guided_json": SCHEMA}, "guided_json"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
    ],
)
def test_bad_structured_requests_get_a_400_naming_why(server, extra, needle, stream):
    for path, body in (
        ("/v1/chat/completions", {"messages": MESSAGES}),
        ("/v1/completions", {"prompt": "x"}),
    ):
        r = httpx.post(server + path, json={**body, "max_tokens": 4, "stream": stream, **extra})
        assert r.status_code == 400, r.text
        assert needle in r.json()["error"]["message"]
    assert httpx.get(server + "/health").status_code == 200
    ok = httpx.post(server + "/v1/completions", json={"prompt": "still", "max_tokens": 2})
    assert ok.status_code == 200


def test_a_bad_grammar_on_native_generate_is_a_400(server):
    body = {"text": "x", "stream": True, "sampling_params": {"regex": "(("}}
    r = httpx.post(server + "/generate", json=body)
    assert r.status_code == 400 and "regex does not compile" in r.json()["error"]["message"]
