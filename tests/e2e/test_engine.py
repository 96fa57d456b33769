"""The engine end to end on the `tiny` preset: greedy outputs are the same with the cache on
or off, under every policy, under memory pressure, chunked, at any page size, and equal to
transformers; nothing leaks; bad input fails alone."""

import asyncio
import itertools

import numpy as np
import pytest
import torch

from radixserve import Engine, SamplingParams
from radixserve.cpu.native import native_available
from radixserve.model import export_preset
from tests.e2e.engine_runs import GREEDY, run, workload


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_equals_transformers_with_cache_on_and_off(reference, page_size):
    on, stats = run(page_size=page_size)
    blocks, block_stats = run(page_size=page_size, cache_index="block-hash")
    off, _ = run(page_size=page_size, enable_prefix_cache=False)
    assert on == blocks == off == reference
    assert stats["hit_tokens"] > 0
    assert block_stats["hit_tokens"] > 0


@pytest.mark.skipif(not native_available(), reason="native kernels did not build")
@pytest.mark.parametrize("page_size", [1, 16])
def test_native_attention_with_cascade_equals_transformers(reference, page_size):
    native, stats = run(
        cascade_min_queries=1,
        page_size=page_size,
        attention_backend="native",
        cascade_min_shared=16,
    )
    plain, plain_stats = run(
        page_size=page_size, attention_backend="native", cascade_attention=False
    )
    torch_outs, _ = run(page_size=page_size, attention_backend="torch")
    assert native == plain == torch_outs == reference
    assert stats["cascade_groups"] > 0 and stats["cascade_saved_tokens"] > 0
    assert plain_stats["cascade_groups"] == 0


@pytest.mark.parametrize(
    "policy, page_size, pool, chunk, preempts",
    [
        ("lpm", 1, 100, 2048, True),
        ("fcfs", 16, 160, 2048, True),
        ("lpm", 16, 192, 32, True),
        ("random", 1, 4096, 16, False),
        ("fcfs", 1, 4096, 2048, False),
        ("dfs-weight", 16, 160, 2048, True),
        ("block-hash", 16, 160, 32, True),
        ("lfu", 16, 160, 32, True),  # LPM scheduling, LFU eviction
    ],
)
def test_pressure_policies_and_chunking_do_not_change_outputs(
    reference, policy, page_size, pool, chunk, preempts
):
    index = "block-hash" if policy == "block-hash" else "radix"
    eviction = "lfu" if policy == "lfu" else "lru"
    policy = "lpm" if policy == "lfu" else policy
    outs, stats = run(
        eviction_policy=eviction,
        page_size=page_size,
        schedule_policy="fcfs" if index == "block-hash" else policy,
        cache_index=index,
        max_total_tokens=pool,
        chunked_prefill_size=chunk,
    )
    assert outs == reference
    assert (stats["preemptions"] > 0) == preempts
    assert stats["hit_tokens"] > 0


@pytest.fixture(scope="module")
def engine():
    with Engine("tiny", page_size=4, check_invariants=True) as e:
        yield e


def test_a_shared_prefix_is_reported_cached(engine):
    rng = np.random.default_rng(1)
    shared = rng.integers(3, 1000, 30).tolist()
    engine.generate(input_ids=shared + [5, 6, 7], sampling_params=GREEDY)
    out = engine.generate(input_ids=shared + [9, 9], sampling_params=GREEDY)
    # 28 in whole pages of 4; the cached page after them begins with the other two shared
    # tokens, which are copied rather than computed
    assert out["meta_info"]["cached_tokens"] == 30


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_a_prompt_cached_whole_computes_only_its_last_token(backend):
    rng = np.random.default_rng(4)
    prompt = rng.integers(3, 1000, 32).tolist()  # eight whole pages of 4
    with Engine("tiny", page_size=4, enable_prefix_cache=False) as e:
        expected = e.generate(input_ids=prompt, sampling_params=GREEDY)["token_ids"]
    with Engine("tiny", page_size=4, attention_backend=backend, check_invariants=True) as e:
        first = e.generate(input_ids=prompt, sampling_params=GREEDY)
        passes = []
        forward = e.runner.forward
        e.runner.forward = lambda batch: passes.append(batch) or forward(batch)
        # twice at once: both copy the head of the cached last page into a page of their own
        again = e.generate(input_ids=[prompt, prompt], sampling_params=GREEDY)
        stats = e.cache_stats()
    assert [o["meta_info"]["cached_tokens"] for o in again] == [31, 31]
    assert [first["token_ids"]] + [o["token_ids"] for o in again] == [expected] * 3
    assert [(w.start, w.end) for w in passes[0].work] == [(31, 32)] * 2  # one token each
    assert stats["kv_used"] == stats["cached_tokens"]  # the copies went back to the pool


def test_a_prompt_waits_for_a_chunked_prefill_it_shares_instead_of_recomputing_it():
    rng = np.random.default_rng(3)
    shared = rng.integers(3, 1000, 300).tolist()
    with Engine("tiny", page_size=4, chunked_prefill_size=128, check_invariants=True) as e:
        outs = e.generate(input_ids=[shared + [1, 2], shared + [3, 4]], sampling_params=GREEDY)
    # The first is prefilled in chunks of 128; the second, seeing budget left beside the last
    # chunk, still waits for it rather than computing the last 44 shared tokens again.
    assert sorted(o["meta_info"]["cached_tokens"] for o in outs) == [0, 300]


def test_max_new_tokens_zero_only_fills_the_cache(engine):
    rng = np.random.default_rng(2)
    prompt = rng.integers(3, 1000, 41).tolist()
    fill = engine.generate(input_ids=prompt, sampling_params=SamplingParams(max_new_tokens=0))
    assert fill["token_ids"] == [] and fill["text"] == ""
    assert fill["meta_info"]["finish_reason"]["type"] == "length"
    out = engine.generate(input_ids=[*prompt, 7], sampling_params=GREEDY)
    assert out["meta_info"]["cached_tokens"] == 40  # the whole prompt, page-aligned
    mixed = engine.generate(
        input_ids=[prompt[:20] + [1], prompt[:20] + [2]],
        sampling_params=[SamplingParams(max_new_tokens=0), GREEDY],
    )
    assert [len(o["token_ids"]) for o in mixed] == [0, GREEDY.max_new_tokens]


def test_a_follow_up_turn_hits_the_whole_previous_conversation(engine):
    tok = engine.tokenizer
    messages = [{"role": "user", "content": "why is the cache hot?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    first_ids = tok(text)["input_ids"]
    first = engine.generate(input_ids=first_ids, sampling_params=GREEDY)
    follow = first_ids + first["token_ids"] + tok("\nmore please")["input_ids"]
    second = engine.generate(input_ids=follow, sampling_params=GREEDY)
    computed = len(first_ids) + len(first["token_ids"]) - 1  # the last token's KV is not
    assert second["meta_info"]["cached_tokens"] == computed - computed % 4


def test_text_prompts_lists_and_per_request_params(engine):
    outs = engine.generate(
        ["the cache", "the tree"],
        [SamplingParams(max_new_tokens=3, temperature=0), SamplingParams(max_new_tokens=5)],
    )
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [3, 5]
    assert all(isinstance(o["text"], str) for o in outs)


def test_seeded_sampling_reproduces(engine):
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, top_k=50, seed=7)
    a = engine.generate("hello there", params)["token_ids"]
    b = engine.generate("hello there", params)["token_ids"]
    assert a == b
    several = engine.generate("hello there", SamplingParams(max_new_tokens=10, n=3, seed=1))
    assert len(several) == 3


def test_stop_strings_and_tokens(engine):
    base = engine.generate(input_ids=[7, 8, 9], sampling_params=GREEDY)
    token = base["token_ids"][3]
    out = engine.generate(
        input_ids=[7, 8, 9],
        sampling_params=SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(token,)),
    )
    assert out["token_ids"] == base["token_ids"][: base["token_ids"].index(token) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": token}
    word = base["text"].split()[1] if len(base["text"].split()) > 1 else base["text"][-1]
    out = engine.generate(
        input_ids=[7, 8, 9],
        sampling_params=SamplingParams(max_new_tokens=12, temperature=0, stop=word),
    )
    assert word not in out["text"]
    assert out["meta_info"]["finish_reason"]["matched"] == word


@pytest.mark.parametrize("with_stop", [False, True])
def test_streaming_adds_up_to_the_final_text(engine, with_stop):
    plain = SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True)
    full = engine.generate("the prefix", plain)
    params = plain
    if with_stop:  # a stop string that completes over more than one token
        words = full["text"].split()
        stop = " ".join(words[2:4]) if len(words) > 3 else full["text"][-4:]
        params = SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True, stop=stop)
        full = engine.generate("the prefix", params)

    async def collect():
        return [chunk async for chunk in engine.generate_stream("the prefix", params)]

    chunks = asyncio.run(collect())
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert "".join(c["text"] for c in chunks[:-1])  # the text streams, not only at the end
    assert list(itertools.chain.from_iterable(c["token_ids"] for c in chunks)) == full["token_ids"]
    assert chunks[-1]["finished"]
    assert chunks[-1]["meta_info"]["completion_tokens"] == len(full["token_ids"])


@pytest.mark.parametrize("stop", [None, "\x00never"])
def test_text_costs_the_new_tokens_per_step_not_the_whole_output(engine, monkeypatch, stop):
    # Decoding the whole output every step would cost ~n^2/2 ids over n tokens.
    decoded = []
    decode = engine.tokenizer.decode

    def counting(ids, **kwargs):
        decoded.append(len(ids))
        return decode(ids, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "decode", counting)
    params = SamplingParams(max_new_tokens=200, temperature=0, ignore_eos=True, stop=stop)
    out = engine.generate(input_ids=[7, 8, 9], sampling_params=params)
    assert out["text"] == decode(out["token_ids"], skip_special_tokens=True)
    assert sum(decoded) <= 6 * 200, sum(decoded)


def test_streamed_samples_of_a_seeded_request_are_the_non_streamed_ones(engine):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7, n=3, ignore_eos=True)
    prompts = ["one prompt", "and another one"]
    whole = engine.generate(prompts, params)

    async def collect():
        return [chunk async for chunk in engine.generate_stream(prompts, params)]

    ids: dict[int, list[int]] = {}
    for chunk in asyncio.run(collect()):
        ids.setdefault(chunk["index"], []).extend(chunk["token_ids"])
    assert [ids[i] for i in range(6)] == [o["token_ids"] for o in whole]
    assert len({tuple(o["token_ids"]) for o in whole[:3]}) == 3  # each sample its own seed


def test_sampling_params_may_be_a_dict_of_their_fields(engine):
    """As SGLang's engine takes them."""
    fields = {"max_new_tokens": 5, "temperature": 0, "stop_token_ids": [3], "ignore_eos": True}
    as_dict = engine.generate(["a tree", "a path"], fields)
    assert [o["token_ids"] for o in as_dict] == [
        o["token_ids"] for o in engine.generate(["a tree", "a path"], SamplingParams(**fields))
    ]
    mixed = engine.generate(["a tree", "a path"], [fields, {"max_new_tokens": 2}])
    assert [o["meta_info"]["completion_tokens"] for o in mixed][1] == 2


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda e: e.generate(""), "empty"),
        (lambda e: e.generate(input_ids=[1] * 5000), "serves at most"),
        (lambda e: e.generate(input_ids=[1, 10**6]), "token ids must lie"),
        (lambda e: e.generate("x", SamplingParams(temperature=-1)), "temperature"),
        (lambda e: e.generate("x", SamplingParams(top_p=0)), "top_p"),
        (lambda e: e.generate("x", SamplingParams(top_p=1.5)), "top_p"),
        (lambda e: e.generate("x", SamplingParams(max_new_tokens=-1)), "max_new_tokens"),
        (lambda e: e.generate("x", {"max_tokens": 3, "topp": 1}), "params: max_tokens, topp$"),
        (lambda e: e.generate("x", {"temperature": -1}), "temperature"),
        (lambda e: e.generate("x", 3), "sampling_params must be"),
    ],
)
def test_bad_input_fails_alone(engine, call, message):
    with pytest.raises(ValueError, match=message):
        call(engine)
    assert engine.generate("still serving", GREEDY)["meta_info"]["completion_tokens"] == 12
    engine.check_invariants()


def test_unknown_policy():
    with pytest.raises(ValueError, match="schedule_policy"):
        Engine("tiny", schedule_policy="sjf")


def test_a_model_that_fails_to_load_raises_and_leaves_no_thread():
    import threading

    before = set(threading.enumerate())
    with pytest.raises(ValueError, match="'no-such-model' is not a preset"):
        Engine("no-such-model")  # built on the scheduler thread, raised here
    for thread in set(threading.enumerate()) - before:
        thread.join(5)
        assert not thread.is_alive(), thread.name


def test_abort_frees_the_request(engine):
    async def go():
        params = SamplingParams(max_new_tokens=2000, temperature=0, ignore_eos=True)
        stream = engine.generate_stream(input_ids=[5, 6, 7], sampling_params=params)
        first = await stream.__anext__()
        engine.abort(first["rid"])
        last = first
        async for chunk in stream:
            last = chunk
        return last

    last = asyncio.run(go())
    assert last["finished"] and last["meta_info"]["finish_reason"]["type"] == "abort"
    engine.check_invariants()
    stats = engine.cache_stats()
    assert stats["running"] == 0 and stats["kv_used"] == stats["cached_tokens"]


def test_demo_shows_the_cache_paying_off(capsys):
    from radixserve.demo import DemoWorkload, print_results, run_demo

    work = DemoWorkload(users=3, turns=2, max_new_tokens=4)
    on, off = run_demo("tiny", work, page_size=4)
    assert on.requests == off.requests == 6
    assert on.hit_rate > 0.5 and off.hit_rate == 0
    assert on.prompt_tokens == off.prompt_tokens  # greedy: the same conversations
    print_results("tiny", work, [on, off])
    assert "hit rate" in capsys.readouterr().out


def test_metrics_count_what_happened():
    with Engine("tiny", page_size=4) as engine:
        shared = list(range(10, 50))
        engine.generate(input_ids=shared + [1], sampling_params=GREEDY)
        engine.generate(input_ids=[[*shared, 2], [7, 7, 7, 7, 7]], sampling_params=GREEDY)
        stats = engine.cache_stats()
    assert stats["finished_requests"] == 3
    assert stats["generated_tokens"] == 36
    assert stats["queried_tokens"] == 41 + 41 + 5
    assert stats["hit_tokens"] == 40
    assert stats["request_hit_rate"] == 1 / 3
    assert 0 < stats["ttft_p50_s"] <= stats["latency_p99_s"]
    assert stats["memory_dedup_ratio"] == 1.0 and stats["running"] == 0


def test_dedup_ratio_counts_shared_prefix_slots():
    from radixserve.engine.reports import dedup_ratio
    from radixserve.engine.req import Req

    a, b = Req("a", np.zeros(8, np.int32), GREEDY), Req("b", np.zeros(8, np.int32), GREEDY)
    a.kv.slots, a.kv.computed_len = np.arange(8), 8
    b.kv.slots, b.kv.computed_len = np.concatenate([np.arange(4), np.arange(20, 24)]), 8
    assert dedup_ratio([a, b]) == 16 / 12


def test_logprobs_match_transformers(reference, tmp_path):
    from transformers import AutoModelForCausalLM

    export_preset("tiny", tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    prompt = workload()[1]
    params = SamplingParams(
        max_new_tokens=6,
        temperature=0,
        ignore_eos=True,
        return_logprob=True,
        top_logprobs_num=3,
        logprob_start_len=10,
    )
    with Engine("tiny", page_size=4) as engine:
        engine.generate(input_ids=prompt, sampling_params=GREEDY)  # cache the whole prompt
        out = engine.generate(input_ids=prompt, sampling_params=params)
    meta = out["meta_info"]
    full = prompt + out["token_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([full])).logits[0].float(), -1)
    inputs = meta["input_token_logprobs"]
    assert [t for _, t in inputs] == prompt[10:]
    for pos, (lp, tok) in enumerate(inputs, start=10):
        assert abs(lp - float(logp[pos - 1, tok])) < 1e-4
    for pos, top in enumerate(meta["input_top_logprobs"], start=10):
        best = logp[pos - 1].topk(3)
        assert [t for _, t in top] == best.indices.tolist()
        assert max(abs(a - b) for (a, _), b in zip(top, best.values.tolist(), strict=True)) < 1e-4
    for i, (lp, tok) in enumerate(meta["output_token_logprobs"]):
        assert abs(lp - float(logp[len(prompt) + i - 1, tok])) < 1e-4
        top = meta["output_top_logprobs"][i]
        assert len(top) == 3 and top[0][1] == tok  # greedy picks the most likely
    assert meta["cached_tokens"] == 9  # capped so positions 9.. are recomputed


def test_parallel_samples_share_the_prompt(engine):
    prompt = list(range(100, 120))
    outs = engine.generate(
        input_ids=prompt, sampling_params=SamplingParams(max_new_tokens=4, n=4, seed=3)
    )
    cached = sorted(o["meta_info"]["cached_tokens"] for o in outs)
    assert cached == [0, 19, 19, 19]  # one computes the prompt, three all but its last token


def test_many_threads_at_once_get_their_own_answers(engine):
    from concurrent.futures import ThreadPoolExecutor

    prompts = workload()
    alone = [engine.generate(input_ids=p, sampling_params=GREEDY)["token_ids"] for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        together = list(
            pool.map(lambda p: engine.generate(input_ids=p, sampling_params=GREEDY), prompts * 2)
        )
    assert [o["token_ids"] for o in together] == alone * 2
    engine.check_invariants()


def test_a_long_queue_is_served_completely():
    with Engine("tiny", page_size=4, max_running_requests=8) as engine:
        prompts = [[5, 6, 7, 8, i % 50 + 10, i % 7 + 3] for i in range(300)]
        outs = engine.generate(
            input_ids=prompts, sampling_params=SamplingParams(max_new_tokens=2, temperature=0)
        )
        assert len(outs) == 300 and all(o["meta_info"]["completion_tokens"] == 2 for o in outs)
        assert engine.cache_stats()["request_hit_rate"] > 0.9


def test_pool_size_options():
    with pytest.raises(ValueError, match="not both"):
        Engine("tiny", max_total_tokens=1024, mem_fraction=0.1)
    with pytest.raises(ValueError, match="mem_fraction"):
        Engine("tiny", mem_fraction=1.5)
    with Engine("tiny", mem_fraction=0.001, page_size=16) as engine:
        slots = engine.allocator.capacity
        assert slots > 0 and slots % 16 == 0
        assert engine.generate("hi", GREEDY)["meta_info"]["completion_tokens"] == 12


def test_unseeded_sampling_differs_between_requests(engine):
    params = SamplingParams(max_new_tokens=30, temperature=5.0, ignore_eos=True)
    outs = engine.generate(input_ids=[[7, 8, 9]] * 4, sampling_params=params)
    assert len({tuple(o["token_ids"]) for o in outs}) > 1


def test_demo_without_a_registry_says_so_and_runs_on_the_preset(monkeypatch, tmp_path, capsys):
    from radixserve.demo import FALLBACK_MODEL, pulled_or_fallback

    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    assert pulled_or_fallback("smollm2-135m-instruct") == FALLBACK_MODEL
    out = capsys.readouterr().out
    assert "could not pull smollm2-135m-instruct" in out and "random weights" in out
