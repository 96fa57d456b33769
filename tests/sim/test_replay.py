"""The simulator against a brute-force reference, and the properties its numbers must have:
Belady bounds every online policy, more room never lowers LRU's or Belady's hit rate, and
room for everything reaches the trace's optimal."""

import json
import random

import numpy as np
import pytest

from radixserve.cli import main
from radixserve.sim.replay import FutureUses, optimal, replay
from radixserve.sim.trace import ChainIds, read_trace, to_request

PAGE = 4


def random_trace(seed: int, n: int = 60, block: int = 8) -> list:
    """Chats under a few shared system prompts, as hash-id rows turned into requests."""
    rng = random.Random(seed)
    ids, counter, convs, rows = ChainIds(), iter(range(10**6)), [], []
    systems = [[next(counter) for _ in range(rng.randint(1, 3))] for _ in range(3)]
    for i in range(n):
        if convs and rng.random() < 0.5:
            conv = rng.choice(convs)
            conv += [next(counter) for _ in range(rng.randint(1, 2))]
        else:
            conv = [*rng.choice(systems), next(counter)]
            convs.append(conv)
        length = block * (len(conv) - 1) + rng.randint(1, block)
        row = {"timestamp": i, "input_length": length, "hash_ids": list(conv)}
        rows.append(to_request(row | {"output_length": rng.randint(1, 9)}, ids, PAGE, block))
    return rows


def reference_lru(requests, capacity_tokens: int) -> tuple[int, int]:
    """Page by page: a cached page's last use is (request, depth); only a page no cached page
    extends may go, the least recently used first; a request's matched pages are held while
    it makes room. Returns (hit tokens, evicted tokens)."""
    cap = capacity_tokens // PAGE
    last: dict[tuple, tuple[int, int]] = {}  # page path -> last use
    fresh, hits, evicted = 10**9, 0, 0

    def evict(n, held):
        nonlocal evicted
        for _ in range(n):
            leaves = [p for p in last if p not in held and not any(q[:-1] == p for q in last)]
            if not leaves:
                return
            del last[min(leaves, key=last.get)]
            evicted += 1

    for r, req in enumerate(requests):
        total = (req.input_length + max(req.output_length - 1, 0)) // PAGE
        seq = req.pages.tolist() + list(range(fresh, fresh + max(total - len(req.pages), 0)))
        fresh += len(seq)
        paths = [tuple(seq[: k + 1]) for k in range(len(seq))]
        matched = 0
        while matched < len(paths) and paths[matched] in last:
            matched += 1
        held = set(paths[:matched])
        for k in range(matched):
            last[paths[k]] = (r, k)
        evict(len(last) + len(paths) - matched - cap, held)
        for k in range(matched, len(paths)):
            last[paths[k]] = (r, k)
        evict(len(last) - cap, set())
        hits += min(matched * PAGE, req.input_length - 1)  # the last token is computed
    return hits, evicted * PAGE


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("capacity", [16, 48, 120])
def test_lru_replay_equals_the_brute_force_reference(seed, capacity):
    trace = random_trace(seed)
    got = replay(trace, PAGE, capacity, "lru")
    hits, evicted = reference_lru(trace, capacity)
    assert (got["prefill_tokens_saved"], got["evictions"]) == (hits, evicted)


@pytest.mark.parametrize("seed", range(6))
def test_belady_bounds_the_online_policies_and_more_room_never_hurts(seed):
    trace = random_trace(seed, n=120)
    future = FutureUses(trace)
    capacities = [8, 16, 32, 64, 128, 256, 512]
    rates = {
        p: [replay(trace, PAGE, c, p, future=future)["token_hit_rate"] for c in capacities]
        for p in ("lru", "lfu", "belady")
    }
    for i in range(len(capacities)):
        assert rates["belady"][i] >= max(rates["lru"][i], rates["lfu"][i]) - 1e-12
    for p in ("lru", "belady"):
        assert rates[p] == sorted(rates[p]), p


@pytest.mark.parametrize(
    ("policy", "index"),
    [("lru", "radix"), ("lfu", "radix"), ("belady", "radix"), ("lru", "block-hash")],
)
def test_room_for_everything_reaches_the_optimal(policy, index):
    trace = random_trace(7)
    row = replay(trace, PAGE, 10**6, policy, index, FutureUses(trace))
    best = optimal(trace, PAGE)
    assert row["token_hit_rate"] == best["token_hit_rate"] > 0.3
    assert row["request_hit_rate"] == best["request_hit_rate"]
    assert row["evictions"] == 0


def test_both_formats_read_into_page_chains(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 2, "input_length": 20, "output_length": 3, "hash_ids": [7, 8, 9]},
        {"timestamp": 1, "input_length": 9, "output_length": 3, "hash_ids": [7, 5]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    first, second = read_trace(path, page_size=4, block_size=8)
    assert first.timestamp == 1  # arrival order
    assert len(first.pages) == 2 and len(second.pages) == 5  # whole pages of the prompt
    assert np.array_equal(first.pages, second.pages[:2])  # block 7 is shared
    tokens = tmp_path / "ids.jsonl"
    prompt = list(range(10))
    lines = [{"input_ids": prompt, "output_length": 2}, {"input_ids": prompt[:8] + [99, 98]}]
    tokens.write_text("\n".join(json.dumps(r) for r in lines))
    a, b = read_trace(tokens, page_size=4)
    assert np.array_equal(a.pages, b.pages) and len(a.pages) == 2
    with pytest.raises(ValueError, match="whole number of pages"):
        read_trace(path, page_size=3, block_size=8)
    (tmp_path / "bad.jsonl").write_text("{nope\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: not JSON"):
        read_trace(tmp_path / "bad.jsonl", page_size=4)


def test_the_command_writes_rows_and_the_capacity_answer(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": i, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3, 4, i]}
        for i in range(30)
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    args = ["simulate", str(trace), "--block-size", "8", "--page-size", "4"]
    args += ["--capacity-tokens", "16", "64", "4096", "--policy", "lru", "lfu", "belady"]
    assert main([*args, "--json", str(out), "--plot", str(png)]) == 0
    result = json.loads(out.read_text())
    assert {r["policy"] for r in result["rows"]} == {"lru", "lfu", "belady"}
    keys = {"policy", "capacity_tokens", "page_size", "token_hit_rate", "request_hit_rate"}
    assert keys | {"prefill_tokens_saved", "evictions"} <= set(result["rows"][0])
    assert result["capacity_for"]["lru"]["99%"] == 64  # the shared 32 tokens plus a request
    assert result["optimal"]["token_hit_rate"] > 0.7
    assert png.stat().st_size > 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 80


def test_held_requests_compete_for_memory_and_locks_are_never_evicted():
    trace = random_trace(3, n=80)
    free = replay(trace, PAGE, 64, "lru")
    held = replay(trace, PAGE, 64, "lru", hold_per_token=3.0)  # a few requests overlap
    assert free["over_capacity"] == 0 and held["over_capacity"] > 0
    assert held["token_hit_rate"] != free["token_hit_rate"]
    forever = replay(trace, PAGE, 64, "lru", hold_per_token=1e9)  # nothing is ever released
    assert forever["evictions"] == 0
    assert forever["token_hit_rate"] == optimal(trace, PAGE)["token_hit_rate"]
