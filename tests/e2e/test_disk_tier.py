"""The disk tier on the tiny preset: a prefix evicted from the pool comes back from disk,
and survives a restart, with greedy outputs equal to recomputing it; a flipped byte is
caught, never used; namespaces and models never share; an unusable folder only turns the
tier off."""

import logging

import numpy as np
import pytest

from radixserve import Engine, SamplingParams

GREEDY = SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True)
POOL = 512  # slots: a 200-token prompt is evicted after a few others


def prompts(seed: int, n: int, length: int = 200) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 1000, length).tolist() for _ in range(n)]


def engine(folder, **options) -> Engine:
    options = {"page_size": 4, "max_total_tokens": POOL, "disk_cache_dir": str(folder)} | options
    return Engine("tiny", check_invariants=True, **options)


@pytest.fixture(scope="module")
def recomputed():
    """Greedy outputs with no cache at all: what every tier must reproduce."""
    with Engine("tiny", enable_prefix_cache=False) as e:
        return [o["token_ids"] for o in e.generate(input_ids=prompts(0, 3), sampling_params=GREEDY)]


def flood(e: Engine) -> None:
    e.generate(input_ids=prompts(99, 6), sampling_params=GREEDY)


def test_an_evicted_prefix_comes_back_from_disk_with_the_same_outputs(tmp_path, recomputed):
    with engine(tmp_path) as e:
        first = e.generate(input_ids=prompts(0, 3), sampling_params=GREEDY)
        flood(e)  # the three prompts leave the pool for the disk
        # one at a time: three 199-token loads at once do not fit a 512-slot pool
        again = [e.generate(input_ids=p, sampling_params=GREEDY) for p in prompts(0, 3)]
        stats = e.cache_stats()
    assert [o["token_ids"] for o in first] == [o["token_ids"] for o in again] == recomputed
    tiers = [o["meta_info"]["cached_tokens_by_tier"] for o in again]
    assert all(t["disk"] > 0 and t["disk"] + t["device"] == 199 for t in tiers)
    assert [o["meta_info"]["cached_tokens"] for o in again] == [199] * 3
    assert stats["disk_hit_tokens"] == sum(t["disk"] for t in tiers)
    assert stats["disk_pages_loaded"] > 0 and stats["disk_pages_demoted"] > 0


def test_a_new_engine_on_the_folder_hits_from_its_first_request(tmp_path, recomputed):
    with engine(tmp_path) as e:
        e.generate(input_ids=prompts(0, 3), sampling_params=GREEDY)
        flood(e)
        outs = [e.generate(input_ids=p, sampling_params=GREEDY) for p in prompts(0, 3)]
        before = [o["meta_info"]["cached_tokens"] for o in outs]
    with engine(tmp_path) as restarted:
        outs = [restarted.generate(input_ids=p, sampling_params=GREEDY) for p in prompts(0, 3)]
    assert [o["token_ids"] for o in outs] == recomputed
    after = [o["meta_info"]["cached_tokens"] for o in outs]
    assert sum(after) >= 0.9 * sum(before) > 0


def test_write_through_writes_finished_requests_without_waiting_for_eviction(tmp_path):
    with engine(tmp_path, write_policy="write_through", max_total_tokens=4096) as e:
        e.generate(input_ids=prompts(0, 1)[0], sampling_params=GREEDY)
        assert e.cache_stats()["disk_pages_demoted"] == (200 + 8 - 1) // 4
    with engine(tmp_path) as restarted:
        out = restarted.generate(input_ids=prompts(0, 1)[0], sampling_params=GREEDY)
    assert out["meta_info"]["cached_tokens_by_tier"]["disk"] == 199


def test_a_flipped_byte_is_dropped_and_recomputed_never_used(tmp_path, recomputed):
    with engine(tmp_path) as e:
        e.generate(input_ids=prompts(0, 3), sampling_params=GREEDY)
        flood(e)
    for segment in tmp_path.glob("*/seg-*.bin"):
        data = bytearray(segment.read_bytes())
        for at in range(200, len(data), 997):  # bytes inside many pages' payloads
            data[at] ^= 0x55
        segment.write_bytes(bytes(data))
    with engine(tmp_path) as restarted:
        outs = [restarted.generate(input_ids=p, sampling_params=GREEDY) for p in prompts(0, 3)]
        stats = restarted.cache_stats()
    assert [o["token_ids"] for o in outs] == recomputed
    assert stats["disk_pages_corrupted"] > 0


def test_namespaces_and_models_never_share_the_disk(tmp_path):
    with engine(tmp_path) as e:
        e.generate(input_ids=prompts(0, 1)[0], sampling_params=GREEDY, namespace="alice")
        flood(e)
        bob = e.generate(input_ids=prompts(0, 1)[0], sampling_params=GREEDY, namespace="bob")
        alice = e.generate(input_ids=prompts(0, 1)[0], sampling_params=GREEDY, namespace="alice")
    assert bob["meta_info"]["cached_tokens"] == 0
    assert alice["meta_info"]["cached_tokens_by_tier"]["disk"] > 0
    with engine(tmp_path, dtype="bfloat16") as other:  # another dtype: another folder
        out = other.generate(input_ids=prompts(0, 1)[0], sampling_params=GREEDY, namespace="alice")
    assert out["meta_info"]["cached_tokens"] == 0


def test_an_unusable_folder_turns_the_tier_off_and_the_engine_serves(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.ERROR), engine(blocker) as e:
        out = e.generate(input_ids=prompts(0, 1)[0], sampling_params=GREEDY)
        assert e.tier is None and "disk_pages" not in e.cache_stats()
    assert out["meta_info"]["completion_tokens"] == 8
    assert "disk cache off" in caplog.text


def test_the_server_reports_disk_hits_in_usage_and_metrics(tmp_path):
    import httpx

    from radixserve.server import create_app
    from tests.e2e.test_server import _serve

    e = engine(tmp_path)
    srv, thread, url = _serve(create_app(e, "tiny"))
    try:
        body = {"prompt": prompts(0, 1)[0], "max_tokens": 4, "temperature": 0}
        httpx.post(url + "/v1/completions", json=body)
        flood(e)
        usage = httpx.post(url + "/v1/completions", json=body).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 199
        text = httpx.get(url + "/metrics").text
        hits = [ln for ln in text.splitlines() if ln.startswith("radixserve_disk_cache_hits")]
        assert hits and float(hits[0].split()[-1]) >= 199
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        e.shutdown()


def test_serve_takes_the_tier_options(tmp_path):
    from radixserve.cli import build_parser

    argv = ["serve", "--disk-cache-dir", str(tmp_path), "--disk-cache-size-gb", "2"]
    args = build_parser(argv).parse_args([*argv, "--write-policy", "write_through"])
    assert (args.disk_cache_dir, args.disk_cache_size_gb) == (str(tmp_path), 2.0)
    assert args.write_policy == "write_through" and args.record_trace is None


def test_others_are_served_while_a_prompt_is_read_from_disk(tmp_path, recomputed):
    import time

    with engine(tmp_path, write_policy="write_through", max_total_tokens=4096) as e:
        long_prompt = prompts(0, 1)[0]
        e.generate(input_ids=long_prompt, sampling_params=GREEDY)
        e.tier.sync()
        e.flush_cache()  # its pages are on disk only
        get_into = e.tier.store.get_into

        def slow_get_into(key, out):
            time.sleep(0.01)  # ~0.5 s for the prompt's 49 pages
            return get_into(key, out)

        e.tier.store.get_into = slow_get_into
        short = SamplingParams(max_new_tokens=2, temperature=0)
        outs = e.generate(input_ids=[long_prompt, [5, 6, 7]], sampling_params=[GREEDY, short])
    slow, quick = (o["meta_info"] for o in outs)
    assert slow["cached_tokens_by_tier"]["disk"] == 199
    assert outs[0]["token_ids"] == recomputed[0]
    assert quick["latency_s"] < 0.5 * slow["ttft_s"]  # it did not wait for the read


def test_a_full_disk_turns_the_tier_off_once_and_the_engine_serves(tmp_path, caplog, recomputed):
    import errno

    with caplog.at_level(logging.ERROR), engine(tmp_path, write_policy="write_through") as e:

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        e.tier.store._seal = full  # every seal fails as on a full disk
        outs = [e.generate(input_ids=p, sampling_params=GREEDY) for p in prompts(0, 3)]
        e.tier.sync()
        again = e.generate(input_ids=prompts(0, 1)[0], sampling_params=GREEDY)
        assert e.cache_stats()["disk_failed"]
    assert [o["token_ids"] for o in outs] == recomputed
    assert again["token_ids"] == recomputed[0]
    assert caplog.text.count("disk cache disabled") == 1
