from radixserve.bench.model_bench import ModelBenchConfig, run_model_bench
from radixserve.cli import main


def test_model_bench_runs_both_sides():
    cfg = ModelBenchConfig(
        preset="tiny",
        dtypes=("float32",),
        prefill_lens=(32,),
        decode_batches=(2,),
        context=32,
        decode_steps=2,
        reps=1,
    )
    rows = run_model_bench(cfg)
    assert [r["case"] for r in rows] == ["prefill 32", "decode batch 2, context 32"]
    for row in rows:
        assert row["ours_tok_s"] > 0 and row["transformers_tok_s"] > 0
        assert abs(row["ratio"] - row["ours_tok_s"] / row["transformers_tok_s"]) < 1e-9


def test_bench_model_command(tmp_path, capsys):
    out = tmp_path / "model.json"
    assert (
        main(
            [
                "bench",
                "model",
                "--model",
                "tiny",
                "--quick",
                "--dtypes",
                "float32",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert "forward throughput" in capsys.readouterr().out
    assert out.is_file()
