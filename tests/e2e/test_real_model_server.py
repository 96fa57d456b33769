"""The server on the real model, spoken to with the official openai client: real text,
streamed and not, the file's chat template, cached tokens on a chat's second turn."""

import openai
import pytest

from radixserve import Engine
from radixserve.server import create_app
from tests.e2e.test_server import _serve
from tests.real_model import REAL_MODEL, chat_ids, gguf_tokenizer_oracle, real_model_file

__all__ = ["gguf_tokenizer_oracle", "real_model_file"]  # fixtures


@pytest.fixture(scope="module")
def client(real_model_file):
    engine = Engine(REAL_MODEL, check_invariants=True)
    srv, thread, url = _serve(create_app(engine, REAL_MODEL))
    yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


def test_a_chat_gets_a_real_answer_streamed_and_not(client, gguf_tokenizer_oracle):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(
        model=REAL_MODEL, messages=messages, max_tokens=20, temperature=0
    )
    assert reply.choices[0].message.content == "The capital of France is Paris."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == len(chat_ids(gguf_tokenizer_oracle, messages))
    stream = client.chat.completions.create(
        model=REAL_MODEL, messages=messages, max_tokens=20, temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == reply.choices[0].message.content


def test_the_second_turn_of_a_chat_hits_the_cache(client):
    messages = [
        {"role": "system", "content": "You are a helpful travel guide for Italy."},
        {"role": "user", "content": "Name a city worth visiting."},
    ]
    first = client.chat.completions.create(
        model=REAL_MODEL, messages=messages, max_tokens=24, temperature=0
    )
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "What should I eat there?"},
    ]
    second = client.chat.completions.create(
        model=REAL_MODEL, messages=messages, max_tokens=24, temperature=0
    )
    assert len(second.choices[0].message.content.split()) >= 3
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16


def test_the_real_model_example_chats_and_hits_the_cache(real_model_file, capsys):
    import runpy
    from pathlib import Path

    example = Path(__file__).parents[2] / "examples" / "real_model_chat.py"
    with Engine(REAL_MODEL) as engine:
        messages = runpy.run_path(str(example))["main"](engine=engine)
        stats = engine.cache_stats()
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 3
    assert all(len(m["content"].split()) >= 2 for m in messages[2::2])
    assert stats["hit_tokens"] > 0.5 * stats["queried_tokens"]
    assert "prompt tokens cached" in capsys.readouterr().out
