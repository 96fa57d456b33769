"""The HTTP server on a free loopback port, spoken to with the official openai client and
plain HTTP: completions, chat, streaming, usage with cached tokens, native routes, errors,
tenant isolation and client disconnects."""

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from radixserve import Engine
from radixserve.server import create_app

KEYS = {"key-alice": "alice", "key-bob": "bob"}
SYSTEM = "You are a careful grader. " * 12


def _serve(app):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def server():
    engine = Engine("tiny", page_size=4, check_invariants=True)
    srv, thread, url = _serve(create_app(engine, "tiny"))
    yield url, engine
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def keyed():
    engine = Engine("tiny", page_size=4)
    srv, thread, url = _serve(create_app(engine, "tiny", api_keys=KEYS))
    yield url, engine
    srv.should_exit = True
    thread.join(timeout=10)


def client(url, key="none"):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_chat_reports_cached_tokens_on_a_shared_prefix(server):
    url, _ = server
    c = client(url)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first?"}]
    first = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0)
    assert first.choices[0].message.role == "assistant"
    assert first.usage.completion_tokens <= 5
    msgs[1]["content"] = "second?"
    second = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 40 and cached > first.usage.prompt_tokens_details.cached_tokens


def test_completions_forms_n_and_logprobs(server):
    url, _ = server
    c = client(url)
    out = c.completions.create(model="tiny", prompt=["a b c", "d e f"], max_tokens=3, temperature=0)
    assert [ch.index for ch in out.choices] == [0, 1]
    assert out.usage.completion_tokens <= 6
    ids = c.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=2, temperature=0)
    assert ids.choices[0].finish_reason in ("length", "stop")
    many = c.completions.create(model="tiny", prompt="x y", max_tokens=2, n=3, seed=1)
    assert len(many.choices) == 3
    lp = c.completions.create(model="tiny", prompt="x y", max_tokens=2, logprobs=2, temperature=0)
    assert len(lp.choices[0].logprobs.token_logprobs) == lp.usage.completion_tokens


def test_logit_bias_over_http_with_the_openai_client(server):
    url, engine = server
    c = client(url)
    token = engine.tokenizer.decode([300])
    msgs = [{"role": "user", "content": "anything"}]
    out = c.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=6, logit_bias={"300": 100}, logprobs=True
    )
    assert [t.token for t in out.choices[0].logprobs.content] == [token] * 6
    assert all(t.logprob > -1e-3 for t in out.choices[0].logprobs.content)
    plain = c.completions.create(model="tiny", prompt=[5, 6], max_tokens=4, temperature=0)
    banned = c.completions.create(
        model="tiny", prompt=[5, 6], max_tokens=4, temperature=0, logprobs=1,
        logit_bias={str(t): -100 for t in engine.tokenizer.encode(plain.choices[0].text)},
    )  # fmt: skip
    assert banned.choices[0].text != plain.choices[0].text


def test_streaming_chat_and_usage(server):
    url, _ = server
    c = client(url)
    msgs = [{"role": "user", "content": "stream me"}]
    plain = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
    stream = c.chat.completions.create(
        model="tiny",
        messages=msgs,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks)


def test_async_client_under_concurrent_load(server):
    url, engine = server

    async def go():
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        calls = [
            c.completions.create(model="tiny", prompt=f"{SYSTEM} q{i}", max_tokens=4, temperature=0)
            for i in range(24)
        ]
        return await asyncio.gather(*calls)

    outs = asyncio.run(go())
    assert len(outs) == 24
    assert sum(o.usage.prompt_tokens_details.cached_tokens for o in outs) > 0
    engine.check_invariants()


def test_native_and_operational_routes(server):
    url, engine = server
    r = httpx.post(
        url + "/generate",
        json={"text": "hello", "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
    )
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 3
    r = httpx.post(
        url + "/generate",
        json={"input_ids": [5, 6, 7], "stream": True, "sampling_params": {"max_new_tokens": 3}},
    )
    lines = [x for x in r.text.splitlines() if x.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["finished"]
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    card = httpx.get(url + "/v1/models").json()["data"][0]
    assert card["id"] == "tiny" and card["max_model_len"] == engine.context_len
    metrics = httpx.get(url + "/metrics").text
    for name in (
        "radixserve_prefix_cache_queries_total",
        "radixserve_prefix_cache_hits_total",
        "radixserve_requests_running",
        "radixserve_kv_cache_usage",
        "radixserve_time_to_first_token_seconds_bucket",
        "radixserve_e2e_request_latency_seconds_count",
    ):
        assert name in metrics
    info = httpx.get(url + "/server_info").json()
    assert "token_hit_rate" in info
    assert info["weights"]["dtype"] == "float32" and info["weights"]["bytes"] > 0
    assert httpx.post(url + "/flush_cache").json() == {"flushed": True}


@pytest.mark.parametrize(
    "payload, needle",
    [
        (b"{not json", ""),
        ({"model": "gpt-9", "prompt": "x"}, "not served here"),
        ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "x", "temperature": 5}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": [1, 2, 99999999]}, "token ids"),
        ({"prompt": "word " * 5000}, "serves at most"),
        ({"prompt": ""}, "prompt: String should have at least 1 character"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[1, 2], []]}, "prompt"),
        ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"five": 1}}, "logit_bias keys must be token ids"),
        ({"prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias token ids"),
        ({"prompt": "x", "suffix": "end"}, "suffix"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "response_format": {"type": "structural_tag"}}, "response_format"),
    ],
)
def test_bad_requests_get_400_and_the_server_keeps_serving(server, payload, needle):
    url, _ = server
    if isinstance(payload, bytes):
        headers = {"content-type": "application/json"}
        r = httpx.post(url + "/v1/completions", content=payload, headers=headers)
    else:
        r = httpx.post(url + "/v1/completions", json=payload)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    ok = httpx.post(url + "/v1/completions", json={"prompt": "still", "max_tokens": 2})
    assert ok.status_code == 200


def test_oversized_body_is_refused(server):
    url, _ = server
    headers = {"content-type": "application/json"}
    r = httpx.post(url + "/v1/completions", content=b"x" * (9 * 1024 * 1024), headers=headers)
    assert r.status_code == 413


def test_client_disconnect_aborts_and_frees(server):
    url, engine = server
    body = {"prompt": "go on", "max_tokens": 3000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one chunk, then hang up
    for _ in range(100):
        stats = engine.cache_stats()
        if stats["running"] == 0:
            break
        time.sleep(0.05)
    assert stats["running"] == 0 and stats["kv_used"] == stats["cached_tokens"]
    assert stats["generated_tokens"] < 3000
    engine.check_invariants()


def test_api_keys_and_tenant_isolation(keyed):
    url, _ = keyed
    with pytest.raises(openai.AuthenticationError):
        client(url, "wrong").completions.create(model="tiny", prompt="x", max_tokens=1)
    assert httpx.post(url + "/v1/completions", json={"prompt": "x"}).status_code == 401
    prompt = SYSTEM + " secret question"
    alice, bob = client(url, "key-alice"), client(url, "key-bob")
    a1 = alice.completions.create(model="tiny", prompt=prompt, max_tokens=1)
    a2 = alice.completions.create(model="tiny", prompt=prompt, max_tokens=1)
    b1 = bob.completions.create(model="tiny", prompt=prompt, max_tokens=1)
    assert a1.usage.prompt_tokens_details.cached_tokens == 0
    assert a2.usage.prompt_tokens_details.cached_tokens > 0
    assert b1.usage.prompt_tokens_details.cached_tokens == 0  # never alice's prefix
    salted = alice.completions.create(
        model="tiny", prompt=prompt, max_tokens=1, extra_body={"cache_salt": "s1"}
    )
    assert salted.usage.prompt_tokens_details.cached_tokens == 0


def test_same_salt_shares_and_metrics_move(server):
    url, _ = server
    c = client(url)

    def counter(name):
        for line in httpx.get(url + "/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(name)

    before = counter("radixserve_prefix_cache_queries_total")
    prompt = SYSTEM + " salted"
    s1 = c.completions.create(
        model="tiny", prompt=prompt, max_tokens=1, extra_body={"cache_salt": "team"}
    )
    s2 = c.completions.create(
        model="tiny", prompt=prompt, max_tokens=1, extra_body={"cache_salt": "team"}
    )
    assert s1.usage.prompt_tokens_details.cached_tokens == 0
    assert s2.usage.prompt_tokens_details.cached_tokens > 0
    assert counter("radixserve_prefix_cache_queries_total") >= before + 2 * s1.usage.prompt_tokens
    assert counter("radixserve_prefix_cache_hits_total") > 0


def test_stop_strings_over_http(server):
    url, _ = server
    c = client(url)
    base = c.completions.create(model="tiny", prompt="the tree", max_tokens=8, temperature=0)
    words = base.choices[0].text.split()
    stop = words[1] if len(words) > 1 else base.choices[0].text[-2:]
    out = c.completions.create(
        model="tiny", prompt="the tree", max_tokens=8, temperature=0, stop=[stop]
    )
    assert stop not in out.choices[0].text
    assert out.choices[0].finish_reason == "stop"


def _sse_events(url, path, body):
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_streamed_seeded_samples_equal_the_non_streamed_ones(server):
    url, _ = server
    body = {"prompt": ["a b c", "d e"], "n": 3, "seed": 7, "temperature": 1.0, "max_tokens": 6}
    whole = httpx.post(url + "/v1/completions", json=body).json()
    texts = {c["index"]: c["text"] for c in whole["choices"]}
    assert len(set(texts.values())) > 1  # the samples differ
    streamed: dict[int, str] = {}
    for event in _sse_events(url, "/v1/completions", {**body, "stream": True}):
        for choice in event["choices"]:
            streamed[choice["index"]] = streamed.get(choice["index"], "") + choice["text"]
    assert streamed == texts


def test_streamed_usage_equals_the_non_streamed_usage(server):
    url, _ = server
    # samples end at random steps (a sampled space or "e" stops them), so they finish out
    # of index order, prompts interleaved
    body = {
        "prompt": ["short", "a much longer prompt than that one"],
        "n": 4,
        "max_tokens": 20,
        "temperature": 1.0,
        "seed": 3,
        "stop": [" ", "e"],
    }
    whole = httpx.post(url + "/v1/completions", json=body).json()
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    last = _sse_events(url, "/v1/completions", stream)[-1]
    assert last["choices"] == []
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert last["usage"][key] == whole["usage"][key]


def test_clients_hanging_up_mid_stream_abort_everything_without_errors(server, caplog):
    url, engine = server
    body = {"prompt": ["go on", "and on"], "n": 3, "max_tokens": 400, "ignore_eos": True}

    async def hang_up(client: httpx.AsyncClient, after: int) -> None:
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen > after:
                    return

    async def main() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            await asyncio.gather(*(hang_up(client, i % 4) for i in range(24)))

    with caplog.at_level("ERROR"):
        asyncio.run(main())
        for _ in range(200):
            stats = engine.cache_stats()
            if stats["running"] == stats["waiting"] == 0:
                break
            time.sleep(0.05)
    assert stats["running"] == stats["waiting"] == 0
    assert stats["kv_used"] == stats["cached_tokens"]
    engine.check_invariants()
    # the server's own errors (a client's leftover tasks may log on the test's side)
    server_errors = [
        r
        for r in caplog.records
        if r.name.startswith(("uvicorn", "radixserve")) or "already running" in r.getMessage()
    ]
    assert not server_errors, caplog.text


def test_echo_returns_the_prompt_before_the_completion(server):
    url, _ = server
    body = {"prompt": "the tree of", "max_tokens": 4, "temperature": 0, "echo": True}
    plain = httpx.post(url + "/v1/completions", json={**body, "echo": False}).json()
    echoed = httpx.post(url + "/v1/completions", json=body).json()
    assert echoed["choices"][0]["text"] == "the tree of" + plain["choices"][0]["text"]
    streamed = "".join(
        c["text"]
        for e in _sse_events(url, "/v1/completions", {**body, "stream": True})
        for c in e["choices"]
    )
    assert streamed == echoed["choices"][0]["text"]
    only = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 0, "logprobs": 0})
    choice = only.json()["choices"][0]
    prompt_tokens = only.json()["usage"]["prompt_tokens"]
    assert choice["text"] == "the tree of"
    assert len(choice["logprobs"]["tokens"]) == prompt_tokens
    logprobs = choice["logprobs"]["token_logprobs"]
    assert logprobs[0] is None and all(lp <= 0 for lp in logprobs[1:])


def test_echoed_prompt_logprobs_come_with_their_alternatives(server):
    """What lm-evaluation-harness reads for a loglikelihood: with ``echo`` and ``logprobs``,
    each prompt token after the first has its logprob and the top alternatives, the most
    likely one at least as likely as the token."""
    url, _ = server
    body = {"prompt": "the tree of life", "max_tokens": 1, "echo": True, "logprobs": 2}
    choice = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]
    logprobs, tops = choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]
    assert len(logprobs) == len(tops) > 2 and logprobs[0] is None and tops[0] is None
    for lp, top in zip(logprobs[1:], tops[1:], strict=True):
        assert len(top) == 2 and max(top.values()) >= lp


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_logprobs_are_the_ones_a_plain_request_gets(server, chat):
    url, _ = server
    if chat:
        route = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "name a tree"}], "top_logprobs": 2}
        body |= {"logprobs": True, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    else:
        route = "/v1/completions"
        body = {"prompt": "the tree of", "echo": True, "logprobs": 2, "max_tokens": 6}
        body |= {"temperature": 0, "ignore_eos": True}

    def entries(logprobs):  # (token, logprob, alternatives) of either shape
        if chat:
            return [
                (e["token"], e["logprob"], {a["token"]: a["logprob"] for a in e["top_logprobs"]})
                for e in logprobs["content"]
            ]
        keys = ("tokens", "token_logprobs", "top_logprobs")
        return list(zip(*(logprobs[k] for k in keys), strict=True))

    plain = httpx.post(url + route, json=body).json()["choices"][0]["logprobs"]
    events = _sse_events(url, route, {**body, "stream": True})
    streamed = [
        e for ev in events for c in ev["choices"] if c["logprobs"] for e in entries(c["logprobs"])
    ]
    assert len(streamed) == len(entries(plain)) >= 6
    for (tok, lp, top), (tok2, lp2, top2) in zip(streamed, entries(plain), strict=True):
        assert tok == tok2 and (lp == lp2 or abs(lp - lp2) < 1e-4)
        assert (top is None) == (top2 is None) and (top or {}).keys() == (top2 or {}).keys()


@pytest.mark.parametrize("stream", [False, True])
def test_echo_of_ids_outside_the_vocabulary_is_a_400(server, stream):
    url, _ = server
    body = {"prompt": [[7, 8], [9, 4588392701]], "max_tokens": 2, "echo": True, "stream": stream}
    r = httpx.post(url + "/v1/completions", json=body)
    assert r.status_code == 400 and "token ids" in r.json()["error"]["message"]


def test_chat_fields_that_would_change_the_answer_are_refused(server):
    url, _ = server
    messages = [{"role": "user", "content": "hi"}]
    for extra in ({"functions": [{"name": "f"}]}, {"function_call": "auto"}):
        r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, **extra})
        assert r.status_code == 400 and "not supported" in r.json()["error"]["message"]
    tool = {"type": "function", "function": {"name": "f"}}
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": 1}}}
    for extra, needle in [
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"tool_choice": "required"}, "needs tools"),
        ({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "'g'"),
        ({"tools": [tool], "tool_choice": "required", "regex": "a+"}, "structured output"),
        ({"tools": [bad_tool], "tool_choice": "required"}, "tools: the JSON schema"),
        ({"messages": [{"role": "user"}]}, "needs content"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "not supported by this server: audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"web_search_options": {}}, "not supported by this server: web_search_options"),
        ({"max_tokens": 3, "max_completion_tokens": 4}, "give one"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "'image_url' are not supported",
        ),
    ]:
        r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, **extra})
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "tools": [tool]})
    assert r.status_code == 400 and "not supported by this server: tools" in r.text
    for name, value in (("no_stop_trim", True), ("include_stop_str_in_output", True)):
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", name: value})
        assert r.status_code == 400 and f"not supported by this server: {name}" in r.text
    fine = {"prompt": "x", "max_tokens": 1, "min_tokens": 0, "skip_special_tokens": True}
    assert httpx.post(url + "/v1/completions", json=fine).status_code == 200
    for name, value in (
        ("image_data", "a.png"),
        ("lora_path", "a"),
        ("return_text_in_logprobs", True),
    ):
        r = httpx.post(url + "/generate", json={"text": "x", name: value})
        assert r.status_code == 400 and f"not supported by this server: {name}" in r.text
    ok = {"messages": messages, "max_tokens": 2, "response_format": {"type": "text"}}
    assert httpx.post(url + "/v1/chat/completions", json=ok).status_code == 200


def test_stop_token_ids_end_an_openai_completion(server):
    url, _ = server
    greedy = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    ids = httpx.post(url + "/generate", json=greedy).json()["token_ids"]
    stop = ids[2]
    body = {"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0, "stop_token_ids": [stop]}
    out = httpx.post(url + "/v1/completions", json=body).json()
    assert out["usage"]["completion_tokens"] == ids.index(stop) + 1
    assert out["choices"][0]["finish_reason"] == "stop"
    held = httpx.post(url + "/v1/completions", json={**body, "min_tokens": 5}).json()
    assert held["usage"]["completion_tokens"] >= 5  # vLLM's min_tokens: no stop before
    too_many = httpx.post(url + "/v1/completions", json={**body, "min_tokens": 7})
    assert too_many.status_code == 400 and "min_new_tokens" in too_many.text


def test_max_completion_tokens_bounds_a_chat_as_max_tokens_does(server):
    url, _ = server
    msgs = [{"role": "user", "content": "tell me about trees"}]
    for limit in (2, 5):
        out = client(url).chat.completions.create(
            model="tiny",
            messages=msgs,
            max_completion_tokens=limit,
            extra_body={"ignore_eos": True},
        )
        assert out.usage.completion_tokens == limit and out.choices[0].finish_reason == "length"


def test_the_openapi_schema_documents_errors_and_constraints(server):
    url, _ = server
    schema = httpx.get(url + "/openapi.json").json()
    completions = schema["paths"]["/v1/completions"]["post"]["responses"]
    assert {"200", "400", "401", "413"} <= set(completions) and "422" not in completions
    prompt = schema["components"]["schemas"]["CompletionRequest"]["properties"]["prompt"]
    assert {"minLength": 1, "type": "string"}.items() <= prompt["anyOf"][0].items()
