"""Tool calling on the real model through the official openai client and the OpenAI Agents
SDK: forced calls always validate against their schemas, streamed calls equal the
non-streamed ones, and a call -> result -> answer loop reuses the cached history."""

import asyncio
import json

import jsonschema
import openai
import pytest

from radixserve import Engine
from radixserve.server import create_app
from tests.e2e.test_server import _serve
from tests.real_model import REAL_MODEL, real_model_file

__all__ = ["real_model_file"]  # fixture

CITY = {"type": "string", "maxLength": 40}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": CITY,
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a city",
            "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]},
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def server(real_model_file):
    engine = Engine(REAL_MODEL, check_invariants=True)
    srv, thread, url = _serve(create_app(engine, REAL_MODEL))
    yield url
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


def ask(client, **options):
    options = {"messages": ASK, "tools": TOOLS, "max_tokens": 160, **options}
    return client.chat.completions.create(model=REAL_MODEL, **options)


def assert_valid(calls) -> None:
    assert calls, "no tool call"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_calls_validate_against_their_schemas_every_time(client):
    for seed in range(20):
        reply = ask(client, tool_choice="required", temperature=1.0, seed=seed)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert_valid(choice.message.tool_calls)
        assert len(choice.message.tool_calls) <= len(TOOLS)


def test_a_named_choice_calls_that_tool_once(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(3):
        reply = ask(client, tool_choice=named, temperature=1.0, seed=seed)
        calls = reply.choices[0].message.tool_calls
        assert_valid(calls)
        assert [c.function.name for c in calls] == ["get_time"]


def test_parallel_tool_calls_false_keeps_one_call(client):
    for seed in range(3):
        reply = ask(client, tool_choice="required", parallel_tool_calls=False, seed=seed)
        assert len(reply.choices[0].message.tool_calls) == 1


def reassembled(stream) -> tuple[str | None, list[tuple[str, str]], str]:
    """Content, (name, arguments) per call and the finish reason of a streamed chat."""
    content, calls, reason = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, ["", ""])
            entry[0] += part.function.name or ""
            entry[1] += part.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    return content or None, [tuple(calls[i]) for i in sorted(calls)], reason


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_streamed_calls_equal_the_non_streamed_ones(client, choice):
    for seed in range(4):
        whole = ask(client, tool_choice=choice, temperature=1.0, seed=seed).choices[0]
        streamed = reassembled(ask(client, tool_choice=choice, temperature=1.0, seed=seed,
                                   stream=True))  # fmt: skip
        calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
        assert streamed == (whole.message.content, calls, whole.finish_reason)


def test_a_call_its_result_and_the_answer_reuse_the_cached_history(client):
    first = ask(client, tool_choice="required", parallel_tool_calls=False, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
    ]
    second = ask(client, messages=history, tool_choice="none", temperature=0, max_tokens=40)
    answer = second.choices[0]
    assert answer.message.content and not answer.message.tool_calls
    assert answer.finish_reason in ("stop", "length")
    # the call was written back as the model wrote it: turn 1's prompt and answer are cached
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 16


def test_an_agents_sdk_agent_runs_three_turns_with_a_function_tool(server):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    asked = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"It is sunny and 21 degrees in {city}."

    model = agents.OpenAIChatCompletionsModel(
        model=REAL_MODEL,
        openai_client=openai.AsyncOpenAI(base_url=server + "/v1", api_key="none", max_retries=0),
    )
    agent = agents.Agent(
        name="weather",
        instructions="Answer questions about the weather with the get_weather tool.",
        tools=[get_weather],
        model=model,
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=80, temperature=0),
    )

    async def conversation() -> list[str]:
        items, answers = [], []
        for city in ("Paris", "Oslo", "Rome"):
            items.append({"role": "user", "content": f"What is the weather in {city}?"})
            result = await agents.Runner.run(agent, items, max_turns=4)
            answers.append(result.final_output)
            items = result.to_input_list()
        return answers

    answers = asyncio.run(conversation())
    assert len(answers) == 3 and all(isinstance(a, str) and a for a in answers)
    assert len(asked) >= 3  # the tool ran in every turn
