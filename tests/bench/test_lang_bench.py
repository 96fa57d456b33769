"""``radixserve bench lang`` on the tiny preset: the DSL programs reach the optimal hit rate."""

from radixserve.bench.lang_bench import LangBenchConfig, run_lang_bench
from radixserve.cli import main


def test_programs_reach_the_optimal_hit_rate_with_the_cache_and_none_without():
    # One tree-of-thought program: two programs' first calls share fewer uncached tokens
    # than the scheduler holds a request back for, so whether the second one hits the
    # first's system prompt depends on whether they land in the same step (a known race).
    # Within the program, two children of one branch share its few reply tokens, under that
    # threshold too: when they land in the same step each computes them (by design, as
    # SGLang's in-batch rule: holding a request back costs more than a few tokens). It
    # reaches 99.0% of the optimal here when they do not; one pair that does costs a few
    # of the program's 711 prompt tokens, which took it below 98% once in a full run.
    cfg = LangBenchConfig(
        model="tiny", few_shot_questions=10, tot_programs=1, tot_width=2, max_tokens=4
    )
    steps = []
    rows = run_lang_bench(cfg, steps.append)
    assert len(steps) == 4
    by = {(r["program"], r["cache"]): r for r in rows}
    for program in ("few-shot", "tree-of-thought"):
        on, off = by[(program, "radix")], by[(program, "off")]
        assert on["prompt_tokens"] == off["prompt_tokens"]  # the same calls either way
        assert on["optimal_hit_rate"] > 0.5
        assert on["of_optimal"] >= (0.98 if program == "few-shot" else 0.96)
        assert off["hit_rate"] == 0.0


def test_bench_lang_command_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "lang.json"
    assert main(["bench", "lang", "--quick", "--model", "tiny", "--json", str(out)]) == 0
    assert "DSL programs with run_batch" in capsys.readouterr().out
    assert out.exists()
    assert main(["bench", "lang", "--model", "tiny", "--programs", "nope"]) == 2
