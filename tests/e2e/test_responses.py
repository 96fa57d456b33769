"""The Responses API on the real model with the official openai client: text and function
tools, streamed events that end in the non-streamed response, and ``previous_response_id``
continuing from stored token ids, so turn 2 finds turn 1 in the cache; stored responses are
each tenant's own."""

import json

import jsonschema
import openai
import pytest

from radixserve import Engine
from radixserve.server import create_app
from tests.e2e.test_server import _serve
from tests.real_model import REAL_MODEL, real_model_file

__all__ = ["real_model_file"]  # fixture

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def url(real_model_file):
    # one-token pages: a turn reuses every stored token but the last, exactly
    engine = Engine(REAL_MODEL, page_size=1, check_invariants=True)
    srv, thread, url = _serve(create_app(engine, REAL_MODEL, api_keys=KEYS))
    yield url
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


def client(url: str, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def create(c, **options):
    options = {"model": REAL_MODEL, "temperature": 0, "max_output_tokens": 40, **options}
    return c.responses.create(**options)


def test_a_text_answer_streamed_and_not(url):
    c = client(url)
    whole = create(c, input="What is the capital of France?", instructions="Be brief.")
    assert whole.status == "completed" and "Paris" in whole.output_text
    events = list(create(c, input="What is the capital of France?", instructions="Be brief.",
                         stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert c.responses.retrieve(whole.id).output_text == whole.output_text


def test_the_next_turn_continues_from_the_stored_tokens(url):
    c = client(url)
    first = create(c, input="Name a large city in Italy.", instructions="Be brief.")
    second = create(c, input="And one in Spain?", instructions="Be brief.",
                    previous_response_id=first.id)  # fmt: skip
    assert second.output_text and second.previous_response_id == first.id
    turn1 = first.usage.input_tokens + first.usage.output_tokens
    # every token of turn 1 is in the cache but the answer's last, the end of turn, which
    # the model wrote but was never fed
    assert second.usage.input_tokens_details.cached_tokens == turn1 - 1
    third = create(c, input="Which of the two is larger?", instructions="Be brief.",
                   previous_response_id=second.id)  # fmt: skip
    turn2 = second.usage.input_tokens + second.usage.output_tokens
    assert third.usage.input_tokens_details.cached_tokens == turn2 - 1


def test_a_function_call_its_output_and_the_answer(url):
    c = client(url)
    ask = "What is the weather in Paris?"
    first = create(c, input=ask, tools=[WEATHER], tool_choice="required", max_output_tokens=80)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    second = create(c, input=[result], tools=[WEATHER], previous_response_id=first.id,
                    tool_choice="none")  # fmt: skip
    assert second.output_text and second.output[0].type == "message"
    turn1 = first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens == turn1 - 1
    streamed = list(create(c, input=ask, tools=[WEATHER], tool_choice="required",
                           max_output_tokens=80, stream=True))  # fmt: skip
    (item,) = streamed[-1].response.output
    assert (item.name, item.arguments) == (call.name, call.arguments)
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == [call.arguments]


def test_structured_text_follows_its_schema(url):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
              "required": ["city"], "additionalProperties": False}  # fmt: skip
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": schema}}
    out = create(c := client(url), input="Name the capital of France.", text=fmt)
    jsonschema.validate(json.loads(out.output_text), schema)
    assert c.responses.retrieve(out.id).text.format.type == "json_schema"


def test_stored_responses_are_each_tenants_own(url):
    mine = create(client(url), input="Hello!")
    theirs = client(url, "key-b")
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        create(theirs, input="Go on.", previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(mine.id)
    unstored = create(client(url), input="Hello!", store=False)
    with pytest.raises(openai.NotFoundError):
        create(client(url), input="Go on.", previous_response_id=unstored.id)
    client(url).responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        client(url).responses.retrieve(mine.id)


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"background": True}, "background"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "'nope'"),
        ({"input": [{"type": "function_call_output", "call_id": "x"}]}, "input"),
    ],
)
def test_fields_that_would_change_the_answer_are_400s(url, options, needle):
    with pytest.raises(openai.BadRequestError, match=needle):
        create(client(url), **{"input": "Hi", **options})
