"""The host tier on the tiny preset (a CPU engine runs the GPU engines' code, with plain
memory for pinned): an evicted prefix comes back from host memory, and from disk once host
memory pushed it down, with greedy outputs equal to recomputing it; a clean shutdown hands
host pages to the disk, so a new engine on the folder hits them."""

from radixserve import Engine

from .test_disk_tier import GREEDY, flood, prompts, recomputed  # noqa: F401 (a fixture)

POOL = 512
HOST_GB = 64 * 2048 / 2**30  # 64 pages of tiny's K/V (2 KiB a page of 4 tokens)


def engine(**options) -> Engine:
    options = {"page_size": 4, "max_total_tokens": POOL} | options
    return Engine("tiny", check_invariants=True, **options)


def served_again(**options) -> tuple[list[dict], dict]:
    """Three prompts served, evicted by others, and served again: the second outputs and
    the engine's stats."""
    with engine(**options) as e:
        e.generate(input_ids=prompts(0, 3), sampling_params=GREEDY)
        flood(e)
        again = [e.generate(input_ids=p, sampling_params=GREEDY) for p in prompts(0, 3)]
        return again, e.cache_stats()


def test_an_evicted_prefix_comes_back_from_host_memory(recomputed):  # noqa: F811
    again, stats = served_again(host_cache_size_gb=1.0)
    assert [o["token_ids"] for o in again] == recomputed
    tiers = [o["meta_info"]["cached_tokens_by_tier"] for o in again]
    assert all(t["host"] > 0 and t["disk"] == 0 and t["device"] + t["host"] == 199 for t in tiers)
    assert stats["host_hit_tokens"] == sum(t["host"] for t in tiers)
    assert stats["host_pages_loaded"] > 0 and "disk_pages" not in stats


def test_host_memory_pushes_pages_down_to_disk_which_serves_them(tmp_path, recomputed):  # noqa: F811
    again, stats = served_again(host_cache_size_gb=HOST_GB, disk_cache_dir=str(tmp_path))
    assert [o["token_ids"] for o in again] == recomputed
    tiers = [o["meta_info"]["cached_tokens_by_tier"] for o in again]
    assert all(t["disk"] > 0 and sum(t.values()) == 199 for t in tiers)
    assert stats["host_pages_evicted"] > 0 and stats["host_pages"] <= 64


def test_a_new_engine_hits_what_host_memory_held_at_shutdown(tmp_path, recomputed):  # noqa: F811
    options = {"host_cache_size_gb": 1.0, "disk_cache_dir": str(tmp_path)}
    with engine(**options) as e:
        e.generate(input_ids=prompts(0, 3), sampling_params=GREEDY)
        flood(e)
        assert e.cache_stats()["disk_pages"] == 0  # all in host memory so far
    with engine(**options) as restarted:
        outs = [restarted.generate(input_ids=p, sampling_params=GREEDY) for p in prompts(0, 3)]
    assert [o["token_ids"] for o in outs] == recomputed
    assert [o["meta_info"]["cached_tokens_by_tier"]["disk"] for o in outs] == [199] * 3
