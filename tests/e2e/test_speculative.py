"""Speculative decoding on the real model (float32): the same greedy tokens, texts, finish
reasons and logprobs with and without it, under stop strings, max_tokens, n > 1, grammars
(drafts cut where the matcher rejects them or jumps forward; tool calls through the server)
and penalties; tree drafts of a question asked again are all kept; the counters reach
``cache_stats`` and ``/metrics``; sampling with drafts still follows each request's seed."""

import json

import httpx
import jsonschema
import numpy as np
import pytest

from radixserve import Engine
from radixserve.engine import SamplingParams
from radixserve.engine.req import Req
from radixserve.engine.speculative.drafts import draft_prefix
from radixserve.server import create_app
from tests.e2e.test_server import _serve
from tests.real_model import REAL_MODEL, real_model_file

__all__ = ["real_model_file"]  # fixture

QUESTIONS = [
    "What is the capital of France?",
    "List three fruits, one per line.",
    "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
]


@pytest.fixture(scope="module")
def engines(real_model_file):
    options = dict(quantize="none", page_size=16, check_invariants=True)
    with (
        Engine(REAL_MODEL, **options) as off,
        Engine(REAL_MODEL, speculative="ngram", speculative_tokens=5, **options) as on,
    ):
        yield off, on


def chat(engine: Engine, text: str) -> list[int]:
    return engine.apply_chat_template([{"role": "user", "content": text}], True)


def test_greedy_outputs_are_the_same_token_for_token(engines):
    off, on = engines
    params = [
        SamplingParams(max_new_tokens=48, temperature=0, return_logprob=True, top_logprobs_num=2),
        SamplingParams(max_new_tokens=40, temperature=0, stop=["mat"]),
        SamplingParams(max_new_tokens=7, temperature=0, n=2),
        SamplingParams(max_new_tokens=30, temperature=0, repetition_penalty=1.2),
        SamplingParams(max_new_tokens=30, temperature=0, json_schema={"type": "object"}),
    ]
    for _ in range(2):  # the second time, tree drafts: the same questions were answered
        for p in params:
            ids = [chat(off, q) for q in QUESTIONS]
            a = off.generate(input_ids=ids, sampling_params=p)
            b = on.generate(input_ids=ids, sampling_params=p)
            for x, y in zip(a, b, strict=True):
                assert x["token_ids"] == y["token_ids"] and x["text"] == y["text"]
                mx, my = x["meta_info"], y["meta_info"]
                assert mx["finish_reason"] == my["finish_reason"]
                got = my.get("output_token_logprobs", [])
                assert [t for _, t in got] == [t for _, t in mx.get("output_token_logprobs", [])]
                for (lx, _), (ly, _) in zip(mx.get("output_token_logprobs", []), got, strict=True):
                    assert ly == pytest.approx(lx, abs=1e-3)
                assert len(my.get("output_top_logprobs", [])) == len(got)
    stats = on.cache_stats()
    assert stats["accepted_tokens_tree"] > 0 and stats["draft_tokens_ngram"] > 0
    assert off.cache_stats()["draft_tokens"] == 0


PLANETS = {
    "type": "object",
    "properties": {
        "star": {"type": "string"},
        "planets": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    },
    "required": ["star", "planets"],
}


@pytest.mark.parametrize("jump_forward", [True, False])
def test_grammar_drafts_keep_constrained_outputs_and_are_kept(engines, jump_forward):
    off, on = engines
    ids = [chat(off, "Name the star and the planets of the solar system, as JSON.")]
    params = SamplingParams(
        max_new_tokens=80, temperature=0, json_schema=PLANETS, jump_forward=jump_forward
    )
    before = on.cache_stats()
    for _ in range(2):  # n-gram drafts, then the tree's continuation of the first answer
        a = off.generate(input_ids=ids, sampling_params=params)[0]
        b = on.generate(input_ids=ids, sampling_params=params)[0]
        assert a["token_ids"] == b["token_ids"]
        assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
        assert b["meta_info"]["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(b["text"]), PLANETS)
    after = on.cache_stats()
    assert after["accepted_tokens_tree"] - before["accepted_tokens_tree"] >= 16


def test_a_draft_is_cut_where_the_grammar_rejects_it_or_jumps_forward(engines):
    _, on = engines
    ids = np.asarray(chat(on, "JSON"), dtype=np.int32)
    good = on.tokenizer.encode('{"star": "Sun", "planets"', add_special_tokens=False)
    bad = on.tokenizer.encode("}}", add_special_tokens=False)
    plain = Req("g", ids, SamplingParams(json_schema=PLANETS, jump_forward=False))
    on.grammars.bind([plain])
    assert draft_prefix(plain, (*good, *bad, *good)) == tuple(good)
    assert draft_prefix(plain, tuple(bad)) == ()
    assert draft_prefix(plain, tuple(good)) == tuple(good)  # the matcher was left as it was
    jumping = Req("j", ids, SamplingParams(json_schema=PLANETS))
    on.grammars.bind([jumping])
    cut = draft_prefix(jumping, tuple(good))
    assert 0 < len(cut) < len(good) and cut == tuple(good[: len(cut)])
    for token in cut:  # where plain decoding would append forced text instead
        assert jumping.grammar.accept_token(token)
    assert jumping.grammar.find_jump_forward_string()


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}},
    "required": ["city"],
}


def test_a_re_emitted_tool_call_is_the_same_with_drafts_from_the_tree(real_model_file):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [tool],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 48,
    }
    calls = {}
    for name, spec in (("off", None), ("on", "ngram")):
        engine = Engine(REAL_MODEL, quantize="none", page_size=16, speculative=spec)
        srv, thread, url = _serve(create_app(engine, "m"))
        try:
            before = engine.cache_stats()
            calls[name] = []
            for _ in range(2):  # the agent's loop asks the same thing again
                reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
                call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
                jsonschema.validate(json.loads(call["arguments"]), WEATHER)
                calls[name].append(call)
            after = engine.cache_stats()
        finally:
            srv.should_exit = True
            thread.join(timeout=10)
            engine.shutdown()
    assert calls["on"] == calls["off"]
    # the grammar jumps over the call's fixed text; the tree drafts what it leaves free
    assert after["accepted_tokens_tree"] > before["accepted_tokens_tree"]


def test_min_new_tokens_holds_off_eos_and_stop_strings_with_drafts_or_without(engines):
    off, on = engines
    ids = chat(off, "Answer with one word: what color is the sky?")
    short = off.generate(input_ids=ids, sampling_params=SamplingParams(temperature=0))
    assert short["meta_info"]["finish_reason"]["type"] == "stop"
    n = len(short["token_ids"])
    held = SamplingParams(max_new_tokens=n + 24, min_new_tokens=n + 12, temperature=0)
    outs = [e.generate(input_ids=ids, sampling_params=held) for e in (off, on)]
    assert outs[0]["token_ids"] == outs[1]["token_ids"]
    tokens = outs[0]["token_ids"]
    assert len(tokens) >= n + 12 and short["token_ids"][-1] not in tokens[: n + 12]
    word = short["text"].strip()[:3]  # a stop string the answer holds early on
    stop = SamplingParams(max_new_tokens=n + 24, min_new_tokens=n + 6, temperature=0, stop=[word])
    assert len(off.generate(input_ids=ids, sampling_params=stop)["token_ids"]) >= n + 6
    with pytest.raises(ValueError, match="min_new_tokens cannot go with regex"):
        SamplingParams(min_new_tokens=2, regex="a+")


def test_tree_drafts_of_a_question_asked_again_are_all_kept(engines):
    _, on = engines
    ids = chat(on, "Name the planets of the solar system.")
    params = SamplingParams(max_new_tokens=64, temperature=0, ignore_eos=True)
    first = on.generate(input_ids=ids, sampling_params=params)
    before = on.cache_stats()
    again = on.generate(input_ids=ids, sampling_params=params)
    after = on.cache_stats()
    assert again["token_ids"] == first["token_ids"]
    drafted = after["draft_tokens_tree"] - before["draft_tokens_tree"]
    kept = after["accepted_tokens_tree"] - before["accepted_tokens_tree"]
    # every whole cached page of the first answer is drafted, and kept
    assert drafted == kept >= 64 - 16 - 1
    assert after["verify_steps"] - before["verify_steps"] < 64 / 3


def test_sampling_with_drafts_follows_each_requests_seed(engines):
    _, on = engines
    ids = chat(on, "Repeat after me: the cat sat on the mat, the cat sat on the mat.")
    params = SamplingParams(max_new_tokens=40, temperature=0.7, seed=11, ignore_eos=True)
    runs = []
    for _ in range(2):
        assert on.flush_cache()
        before = on.cache_stats()["draft_tokens"]
        runs.append(on.generate(input_ids=ids, sampling_params=params)["token_ids"])
        assert on.cache_stats()["draft_tokens"] > before  # its own words drafted
    assert runs[0] == runs[1] and len(runs[0]) == 40


def test_the_server_reports_draft_counters():
    engine = Engine("tiny", page_size=4, speculative="ngram", check_invariants=True)
    srv, thread, url = _serve(create_app(engine, "tiny"))
    try:
        body = {"input_ids": [5, 6, 7, 5, 6], "sampling_params": {"max_new_tokens": 24}}
        body["sampling_params"]["temperature"] = 0
        for _ in range(2):
            assert httpx.post(url + "/generate", json=body).status_code == 200
        metrics = httpx.get(url + "/metrics").text
        values = {
            line.split()[0]: float(line.split()[1])
            for line in metrics.splitlines()
            if line.startswith("radixserve_spec_")
        }
        assert values["radixserve_spec_accepted_tokens_tree_total"] > 0
        assert "radixserve_spec_draft_tokens_ngram_total" in values
        assert values["radixserve_spec_mean_accepted_length"] > 0
        info = httpx.get(url + "/server_info").json()
        assert info["config"]["speculative"] == "ngram" and info["verify_steps"] > 0
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        engine.shutdown()
