"""``radixserve bench serving`` on the tiny preset, small: every configuration serves every
workload, the caches reach the optimal hit rate, and the command writes its outputs."""

import json

import pytest

from radixserve.bench.workloads_bench import ServingBenchConfig, run_serving_bench
from radixserve.cli import main


@pytest.fixture(scope="module")
def result():
    cfg = ServingBenchConfig(
        model="tiny",
        workloads=("few-shot", "multi-turn-chat", "tree-of-thought", "no-sharing"),
        scale=0.25,
        max_tokens=3,
        kv_tokens=8192,
        rounds=2,
    )
    steps = []
    out = run_serving_bench(cfg, steps.append)
    out["steps"] = steps
    return out


def test_every_configuration_serves_every_workload(result):
    rows = result["rows"]
    assert len(result["steps"]) == 4 * 5 * 2  # two rounds each
    assert {(r["workload"], r["config"]) for r in rows} == {
        (w, c)
        for w in ("few-shot", "multi-turn-chat", "tree-of-thought", "no-sharing")
        for c in ("radix-lpm", "radix-fcfs", "block-hash-fcfs", "off", "transformers")
    }
    for r in rows:
        assert r["seconds"] > 0 and r["requests"] > 0


def test_caches_reach_the_optimal_and_cache_off_computes_everything(result):
    by = {(r["workload"], r["config"]): r for r in result["rows"]}
    for workload, optimal in result["optimal"].items():
        off = by[(workload, "off")]
        assert off["hit_rate"] == 0.0
        for config in ("radix-lpm", "radix-fcfs", "block-hash-fcfs"):
            r = by[(workload, config)]
            assert r["hit_rate"] == pytest.approx(optimal, abs=0.02), (workload, config)
            assert r["hit_rate"] <= optimal + 1e-9  # no cache beats an unlimited one
            assert r["prefill_tokens"] < off["prefill_tokens"] or optimal == 0
            assert r["lookup_p50_us"] > 0
    assert result["optimal"]["no-sharing"] == 0.0


def test_each_configuration_is_compared_with_the_first_round_by_round(result):
    rows = {(r["workload"], r["config"]): r for r in result["rows"]}
    pairs = {(p["workload"], p["config"]): p for p in result["pairs"]}
    assert set(pairs) == {k for k in rows if k[1] != "radix-lpm"}
    for (workload, config), p in pairs.items():
        mine, first = rows[(workload, config)], rows[(workload, "radix-lpm")]
        ratios = [a / b for a, b in zip(mine["round_seconds"], first["round_seconds"], strict=True)]
        assert p["vs"] == "radix-lpm" and p["rounds"] == 2
        assert p["ratio_min"] == min(ratios) and p["ratio_max"] == max(ratios)
        assert p["ratio_min"] <= p["time_ratio"] <= p["ratio_max"]
        assert p["prefill_ratio"] == mine["prefill_tokens"] / first["prefill_tokens"]
        # the row is the median round
        assert mine["seconds"] in mine["round_seconds"]


def test_bench_serving_command_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "serving.json", tmp_path / "serving.png"
    args = ["bench", "serving", "--model", "tiny", "--workloads", "rag", "--scale", "0.25"]
    args += ["--max-tokens", "2", "--configs", "radix-lpm", "off", "--json", str(out)]
    assert main([*args, "--plot", str(png)]) == 0
    data = json.loads(out.read_text())
    assert {r["config"] for r in data["rows"]} == {"radix-lpm", "off"}
    assert png.stat().st_size > 0
    assert main(["bench", "serving", "--model", "tiny", "--workloads", "nope"]) == 2
