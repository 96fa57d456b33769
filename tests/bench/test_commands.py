import json
from datetime import date

import pytest

from radixserve.bench.cache_bench import CacheBenchConfig, TreeShape, run_cache_bench
from radixserve.cli import main
from radixserve.cpu.native import native_available
from tests.real_model import real_model_file

__all__ = ["real_model_file"]  # fixture


def test_tree_shapes_hit_what_they_promise():
    shape = TreeShape.for_sizes(100_000, 4096)
    assert shape.hit_len == 4096
    assert 0.8 * 100_000 <= shape.tree_tokens <= 100_000
    assert TreeShape.for_sizes(10_000, 32768) is None


def test_cache_bench_rows(tmp_path):
    cfg = CacheBenchConfig(
        page_sizes=(1, 16),
        tree_sizes=(10_000,),
        hit_lens=(256,),
        include_peer_shape=False,
        queries=20,
        rounds=2,
        evict_leaves=400,
        evictions=50,
    )
    rows = run_cache_bench(cfg)
    assert [(r["page_size"], r["op"]) for r in rows] == [
        (1, "match"),
        (1, "insert"),
        (1, "evict leaf"),
        (16, "match"),
        (16, "insert"),
        (16, "evict leaf"),
    ]
    for row in rows:
        assert 0 < row["p50_us"] <= row["p99_us"]
    assert rows[2]["leaves"] == 400


def test_bench_cache_command_writes_json(tmp_path, capsys):
    out = tmp_path / "cache.json"
    args = ["bench", "cache", "--quick", "--page-sizes", "16"]
    assert main([*args, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {r["op"] for r in data["rows"]} == {"match", "insert", "evict leaf"}
    assert data["cpu_profile"]["features"] and data["machine"]["cores"] >= 1
    assert "p50" in capsys.readouterr().out


def test_bad_arguments_fail_cleanly(capsys):
    assert main(["bench", "serving", "--model", "tiny", "--configs", "nope"]) == 2
    assert "unknown config 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["no-such-command"])


def test_optimal_hit_rate_counts_each_prefix_once_and_decoded_tokens_as_computed():
    from radixserve.sim.optimal import optimal_hit_rate

    calls = [
        ([1, 2, 3, 4], [5, 6, 7]),
        ([1, 2, 3, 4, 5, 6, 7, 8], [9]),  # the conversation so far, extended
        ([1, 2, 9], [0]),
    ]
    # [..5] and [..6] were computed by the first call's decode; 7 (the last reply token)
    # and 8 by the second call; 9 after [1, 2] by the third
    assert optimal_hit_rate(calls) == pytest.approx(1 - 7 / 15)
    assert optimal_hit_rate([([1, 2], [3])]) == 0.0
    # every call computes its last prompt token, cached or not
    assert optimal_hit_rate([([1, 2, 3], None), ([1, 2, 3], None)]) == pytest.approx(2 / 6)
    assert optimal_hit_rate([([1, 2, 3, 4, 5], None)] * 2, page_size=2) == pytest.approx(4 / 10)


def test_serving_workloads_are_seeded_and_know_their_optimal():
    from radixserve.bench.workloads import SERVING_WORKLOADS, make_workload

    for name in SERVING_WORKLOADS:
        a, b = make_workload(name, 5000, seed=3), make_workload(name, 5000, seed=3)
        assert [r.prompt.tolist() for r in a.requests] == [r.prompt.tolist() for r in b.requests]
        assert all(r.prompt.max() < 5000 for r in a.requests)
        optimal = a.optimal_hit_rate(16)
        assert (optimal == 0.0) == (name == "no-sharing")
        assert 0 <= optimal < 1 and a.optimal_hit_rate(1) >= optimal
    chat = make_workload("multi-turn-chat", 5000)
    waves = chat.waves
    assert len(waves) == 4 and all(len(w) == 8 for w in waves)
    assert waves[0][0].prompt.tolist() == waves[1][0].prompt[: len(waves[0][0].prompt)].tolist()
    with pytest.raises(ValueError):
        make_workload("nope", 5000)


def test_report_weaves_json_tables_into_the_notes(tmp_path):
    from radixserve.bench.docs_report import render
    from radixserve.cpu import probe_cpu_profile
    from radixserve.tables import machine, write_json

    (tmp_path / "notes").mkdir()
    head = "title: DSL programs\ncommand: radixserve bench lang\ncpu: a test CPU\n"
    module = "module: radixserve.bench.lang_bench\n\n"
    marks = "<!-- table lang cache=radix -->\n\n<!-- table lang@x,nope@y title=Both -->"
    (tmp_path / "notes" / "lang.md").write_text(f"{head}{module}Before.\n\n{marks}\n\nAfter.\n")
    tiers = "title: Tiers\ncpu: a test CPU\nmodule: radixserve.bench.tiers_bench\n\n"
    (tmp_path / "notes" / "tiers.md").write_text(tiers + "<!-- table tiers -->\n")
    rows = [{"program": "few-shot", "cache": "radix", "calls": 3, "hit_rate": 0.5}]
    rows.append({"program": "few-shot", "cache": "off", "calls": 3, "hit_rate": 0.0})
    write_json(tmp_path / "bench_lang.json", {"config": {}, "rows": rows})
    text = render(tmp_path)
    lang = text[text.index("## DSL programs") :].split("\n## ")[0]
    assert "Before." in lang and "After." in lang and "radixserve bench lang" in lang
    first, both = lang.split("### Both")
    assert "| few-shot | radix | 3 | 50.0% |" in first and "| off |" not in first  # filtered
    assert "| x | few-shot | off | 3 | 0.0% |" in both  # a labelled source: its own column
    assert f"{machine()['cpu']} (a test CPU)" in lang
    assert f"measured {date.today().isoformat()}" in lang
    assert f"*CPU profile: {probe_cpu_profile().summary()}.*" in lang  # the paths it ran on
    assert "not measured yet" in text  # sections without JSON say so
    assert "cores" in text.split("\n## ")[0]  # the machines are described up front


@pytest.mark.skipif(not native_available(), reason="native kernels did not build")
def test_bench_kernels_command_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "kernels.json", tmp_path / "kernels.png"
    args = ["bench", "kernels", "--quick", "--dtypes", "float32", "--json", str(out)]
    assert main([*args, "--plot", str(png)]) == 0
    data = json.loads(out.read_text())
    assert {r["kernel"] for r in data["rows"]} == {"decode", "extend", "cascade"}
    assert [r["case"] for r in data["linear"]] == ["1 rows x 2 layers", "5 rows x 2 layers"]
    for r in data["linear"]:
        assert r["native_ms"] > 0 and r["torch_ms"] > 0 and r["of_read_limit"] > 0
    for r in data["rows"]:
        assert r["native_ms"] > 0 and r["read_limit_ms"] > 0 and r["of_read_limit"] > 0
        # the cascade row times the kernel grouped against itself plain, the others torch
        assert r["plain_ms" if r["kernel"] == "cascade" else "torch_ms"] > 0
    assert data["read_gb_s"] > 0
    assert png.stat().st_size > 0
    assert "read bandwidth" in capsys.readouterr().out


def test_bench_model_command_compares_with_transformers(tmp_path, capsys):
    out = tmp_path / "model.json"
    args = ["bench", "model", "--quick", "--model", "tiny", "--dtypes", "float32"]
    assert main([*args, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"].split()[0] for r in rows] == ["prefill", "decode", "decode"]
    for r in rows:  # (the run refuses to time models whose logits differ)
        assert r["ours_tok_s"] > 0 and r["transformers_tok_s"] > 0
        assert r["read_ms"] > 0 and r["x_read"] > 0
    # decode steps read the weights and every request's cached K/V: more requests, more bytes
    _, one, four = rows
    assert four["read_ms"] > one["read_ms"]
    assert "transformers" in capsys.readouterr().out


def test_terminal_tables_fit_80_columns_unless_wide(capsys):
    from radixserve.bench.workloads_bench import TABLES
    from radixserve.tables import print_tables

    row = {c.key: 123456.789 for c in TABLES[0].columns} | {"workload": "few-shot"}
    print_tables({"rows": [row]}, TABLES[:1])
    narrow = capsys.readouterr().out
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert "prefilled" not in narrow  # a wide column
    print_tables({"rows": [row]}, TABLES[:1], wide=True)
    assert "prefilled" in capsys.readouterr().out


def test_bench_structured_command_compares_masks_and_jump_forward(tmp_path, capsys):
    out, png = tmp_path / "structured.json", tmp_path / "structured.png"
    args = ["bench", "structured", "--quick", "--model", "tiny", "--json", str(out)]
    assert main([*args, "--plot", str(png)]) == 0
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"constrained", "jump-forward", "free"}
    # the free run is held to the constrained run's lengths: the same decode steps
    assert rows["free"]["output_tokens"] == rows["constrained"]["output_tokens"]
    assert rows["free"]["steps"] == rows["constrained"]["steps"]
    assert rows["jump-forward"]["steps"] < rows["constrained"]["steps"]
    assert rows["jump-forward"]["jumped_tokens"] > 0 and rows["constrained"]["jumped_tokens"] == 0
    assert rows["free"]["valid"] == 0
    assert png.stat().st_size > 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80


def test_bench_tiers_command_measures_disk_hits_and_a_restart(tmp_path, capsys):
    out = tmp_path / "tiers.json"
    assert main(["bench", "tiers", "--quick", "--model", "tiny", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {r["source"]: r for r in data["rows"]}
    assert set(rows) == {"recompute", "device", "disk (dropped)", "disk (page cache)"}
    assert rows["recompute"]["vs_recompute"] == 1.0
    before, after = data["restart"]
    assert before["hit_tokens"] > 0 and after["disk_hit_tokens"] > 0
    assert after["of_before"] >= 0.9
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 80


def test_bench_cluster_command_compares_the_routers(tmp_path, capsys):
    out, png = tmp_path / "cluster.json", tmp_path / "cluster.png"
    assert main(["bench", "cluster", "--quick", "--json", str(out), "--plot", str(png)]) == 0
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"single", "prefix", "round-robin", "power-of-two"}
    assert all(r["errors"] == 0 and 0 < r["hit_rate"] < 1 for r in rows.values())
    assert rows["single"]["hit_vs_single"] == 1.0 and rows["round-robin"]["req_s_vs_rr"] == 1.0
    assert png.stat().st_size > 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 80


def test_bench_spec_command_compares_speculation_off_and_on(tmp_path, capsys, real_model_file):
    out = tmp_path / "spec.json"
    args = ["bench", "spec", "--quick", "--workloads", "questions", "rewrite"]
    assert main([*args, "--json", str(out)]) == 0  # nonzero when any greedy output differs
    data = json.loads(out.read_text())
    assert len(data["pairs"]) == 4 and {p["same"] for p in data["pairs"]} == {"yes"}
    on = [r for r in data["rows"] if r["config"] == "on"]
    assert all(r["drafted"] > 0 for r in on)
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 80
