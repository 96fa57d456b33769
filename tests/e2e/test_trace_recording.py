"""A trace recorded by the engine replays, through the simulator, to the hit rate the
engine measured (less the page heads it copies, which page hashes cannot show); it holds
hashes of pages, never the tokens."""

import json

import numpy as np
import pytest

from radixserve import Engine, SamplingParams
from radixserve.sim.replay import replay
from radixserve.sim.trace import read_trace

PAGE = 4


@pytest.mark.parametrize("system_len", [36, 37])
def test_a_recorded_trace_replays_to_the_engines_hit_rate(tmp_path, system_len):
    path = tmp_path / "trace.jsonl"
    rng = np.random.default_rng(0)
    systems = [rng.integers(3, 1000, system_len).tolist() for _ in range(2)]
    params = SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)
    with Engine("tiny", page_size=PAGE, record_trace=str(path)) as engine:
        for chat in range(4):  # multi-turn chats: each turn extends the last answer
            history = systems[chat % 2] + rng.integers(3, 1000, 5).tolist()
            for _ in range(3):
                out = engine.generate(input_ids=history, sampling_params=params)
                history = history + out["token_ids"] + rng.integers(3, 1000, 7).tolist()
        engine.generate(input_ids=[5, 6, 7], sampling_params=params, namespace="tenant")
        measured = engine.cache_stats()["token_hit_rate"]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 13 and all("input_ids" not in r for r in rows)
    assert rows[-1]["namespace"] != "tenant"  # salted, not the name
    trace = read_trace(path, page_size=PAGE)
    replayed = replay(trace, PAGE, 10**6, "lru")
    assert measured > 0.5
    if system_len % PAGE == 0:  # the prompts share whole pages only
        assert replayed["token_hit_rate"] == measured
    else:  # the engine also copies the head of the page a system prompt ends in, which a
        # trace of page hashes cannot show: at most a page less one token per request
        prompt = sum(r.input_length for r in trace)
        gap = measured - replayed["token_hit_rate"]
        assert 0 < gap <= (PAGE - 1) * len(trace) / prompt


def test_two_recordings_of_the_same_traffic_share_no_hashes(tmp_path):
    ids = list(range(3, 40))
    hashes = []
    for name in ("a", "b"):
        with Engine("tiny", page_size=PAGE, record_trace=str(tmp_path / name)) as engine:
            engine.generate(input_ids=ids, sampling_params=SamplingParams(max_new_tokens=2))
        hashes.append(set(json.loads((tmp_path / name).read_text())["hash_ids"]))
    assert hashes[0] and not hashes[0] & hashes[1]
