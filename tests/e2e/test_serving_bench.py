"""``radixserve bench serving`` on the tiny preset, small: every configuration serves every
workload, the caches reach the optimal hit rate, and the command writes its outputs."""

import json
import math

import pytest

from radixserve.bench.serving_bench import (
    ServingBenchConfig,
    _t_quantile,
    check_targets,
    ratio_interval,
    run_serving_bench,
)
from radixserve.cli import main


@pytest.fixture(scope="module")
def result():
    cfg = ServingBenchConfig(
        model="tiny",
        workloads=("few-shot", "multi-turn-chat", "tree-of-thought", "no-sharing"),
        scale=0.25,
        max_tokens=3,
        kv_tokens=8192,
        sweep_workloads=("multi-turn-chat", "tree-of-thought"),
        sweep_fractions=(1.0, 0.25),
    )
    steps = []
    out = run_serving_bench(cfg, steps.append)
    out["steps"] = steps
    return out


def test_every_configuration_serves_every_workload(result):
    rows = result["rows"]
    assert len(result["steps"]) == 4 * 5 + 2 * 4
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
            assert r["prefill_tokens"] < off["prefill_tokens"] or optimal == 0
            assert r["lookup_p50_us"] > 0
    assert result["optimal"]["no-sharing"] == 0.0


def test_the_sweep_shrinks_the_pool_and_the_targets_are_judged(result):
    sweep = result["sweep"]
    assert {r["config"] for r in sweep} == {"radix-lpm", "block-hash-fcfs"}
    assert {r["workload"] for r in sweep} == {"multi-turn-chat", "tree-of-thought"}
    for workload in ("multi-turn-chat", "tree-of-thought"):
        pools = [r["kv_tokens"] for r in sweep if r["workload"] == workload]
        assert min(pools) < max(pools)
    targets = check_targets(result["rows"], sweep)
    assert {t["target"] for t in targets} >= {
        "hit rate / optimal",
        "throughput / cache off",
        "hit rate - block-hash-fcfs (points)",
    }
    assert all(t["met"] in ("yes", "no", "yes (same batches, less engine time)") for t in targets)
    squeezed = [t for t in targets if t["target"] == "hit rate - block-hash-fcfs (points)"]
    assert {t["workload"].split(",")[0] for t in squeezed} == {"multi-turn-chat", "tree-of-thought"}


def test_runs_that_computed_the_same_batches_say_so(result):
    by = {(r["workload"], r["config"]): r for r in result["rows"]}
    for workload in result["optimal"]:
        radix, block = by[(workload, "radix-fcfs")], by[(workload, "block-hash-fcfs")]
        assert radix["batches"] == block["batches"]  # same order, same hits: same passes
        for r in (radix, block):
            assert 0 < r["round_engine_seconds"][0] < r["round_seconds"][0]
    assert by[("no-sharing", "off")]["batches"] == by[("no-sharing", "radix-lpm")]["batches"]
    assert by[("few-shot", "off")]["batches"] != by[("few-shot", "radix-lpm")]["batches"]
    assert "batches" not in by[("few-shot", "transformers")]


def test_radix_and_block_hash_are_compared_round_by_round():
    rows = [
        {
            "workload": "w",
            "config": "radix-lpm",
            "seconds": 1.0,
            "round_seconds": [1.0, 2.0, 1.1],
            "prefill_tokens": 100,
        },
        {
            "workload": "w",
            "config": "block-hash-fcfs",
            "seconds": 1.0,
            "round_seconds": [1.1, 2.0, 1.0],
            "prefill_tokens": 120,
        },
    ]
    (work,) = [t for t in check_targets(rows) if t["target"].startswith("prefilled tokens")]
    assert work["measured"] == pytest.approx(1.2) and work["met"] == "yes"
    (target,) = [t for t in check_targets(rows) if t["target"] == "throughput / block-hash-fcfs"]
    assert target["measured"] == pytest.approx(1.0)  # median of 1.1, 1.0, 0.909
    assert target["rounds"] == "0.91 to 1.10 (3 rounds; 95% interval 0.79 to 1.26)"
    rows[1]["round_seconds"] = [1.0, 1.9, 1.0]  # slower in the median
    (target,) = [t for t in check_targets(rows) if t["target"] == "throughput / block-hash-fcfs"]
    assert target["met"] == "no"  # radix prefilled fewer tokens: no excuse
    rows[1]["prefill_tokens"] = 100
    (target,) = [t for t in check_targets(rows) if t["target"] == "throughput / block-hash-fcfs"]
    assert target["met"] == "tie (same work)"  # same work; its interval holds 1.0
    rows[1]["round_seconds"] = [0.9, 1.9, 1.0]  # every round behind, and consistently: a loss
    (target,) = [t for t in check_targets(rows) if t["target"] == "throughput / block-hash-fcfs"]
    assert target["met"] == "no"
    # The same batches, hashed, and block-hash spent more time around the forward passes:
    # judged at each pair's mean forward time, radix is ahead.
    for row, engine_seconds in zip(rows, ([0.1, 0.1, 0.1], [0.2, 0.2, 0.2]), strict=True):
        row["round_engine_seconds"], row["batches"] = engine_seconds, "same"
    (target, same) = [t for t in check_targets(rows) if t["target"].startswith("throughput / b")]
    assert same["target"] == "throughput / block-hash-fcfs, same batches"
    assert same["measured"] == pytest.approx(1.1)  # median of 1.0/0.9, 2.0/1.9, 1.1/1.0
    assert target["met"] == "yes (same batches, less engine time)"
    rows[1]["round_engine_seconds"] = [0.2, 0.0, 0.05]  # engine time either side: a tie
    (target, same) = [t for t in check_targets(rows) if t["target"].startswith("throughput / b")]
    assert same["met"] == "tie (same batches)" and target["met"] == "no"
    rows[1]["batches"] = "other"  # different passes: the wall clock alone decides
    targets = check_targets(rows)
    assert not [t for t in targets if t["target"].endswith("same batches")]
    rows[1]["round_seconds"] = [1.2]  # a single round: best against best
    (target,) = [t for t in check_targets(rows) if t["target"] == "throughput / block-hash-fcfs"]
    assert target["measured"] == pytest.approx(1.0) and target["rounds"] == ""


def test_ratio_interval_is_students_t_on_the_logs():
    # Student's t quantiles from the table: 4.303 (2 degrees of freedom), 2.262 (9)
    assert _t_quantile(0.975, 2) == pytest.approx(4.303, rel=0.01)
    assert _t_quantile(0.975, 9) == pytest.approx(2.262, rel=0.001)
    low, high = ratio_interval([1.1, 1.0, 1 / 1.1])  # logs +-0.0953 around 0
    half = 4.303 * 0.09531 / 3**0.5
    assert low == pytest.approx(math.exp(-half), rel=0.01)
    assert high == pytest.approx(math.exp(half), rel=0.01)
    # All three rounds behind by 2-5%: three rounds cannot tell that from the noise here,
    # thirty of the same can.
    assert ratio_interval([0.95, 0.97, 0.98])[1] > 1.0
    assert ratio_interval([0.95, 0.97, 0.98] * 10)[1] < 1.0


def test_bench_serving_command_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "serving.json", tmp_path / "serving.png"
    args = ["bench", "serving", "--model", "tiny", "--workload", "rag", "--scale", "0.25"]
    args += ["--max-tokens", "2", "--configs", "radix-lpm", "off", "--json", str(out)]
    assert main([*args, "--plot", str(png)]) == 0
    data = json.loads(out.read_text())
    assert {r["config"] for r in data["rows"]} == {"radix-lpm", "off"}
    assert png.stat().st_size > 0
    assert main(["bench", "serving", "--model", "tiny", "--workload", "nope"]) == 2
