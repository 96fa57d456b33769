"""``radixserve serve``'s engine flags are ``EngineConfig``'s fields: every field has one,
with the field's default and help, and docs/engine.md's options table is theirs too."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from radixserve.cli import build_parser
from radixserve.engine.config import EngineConfig
from radixserve.engine.config_flags import (
    add_config_arguments,
    config_options,
    engine_config,
    engine_options,
    flags_of,
    render_docs,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "engine.md"
FIELDS = [f.name for f in dataclasses.fields(EngineConfig)]
# a field: the words after its flag, and the value they give (each unlike the default)
VALUES: dict[str, tuple[list[str], object]] = {
    "model": (["smollm2-135m-instruct"], "smollm2-135m-instruct"),
    "page_size": (["4"], 4),
    "max_total_tokens": (["4096"], 4096),
    "mem_fraction": (["0.5"], 0.5),
    "max_running_requests": (["8"], 8),
    "schedule_policy": (["fcfs"], "fcfs"),
    "lpm_aging_tokens_per_s": (["500.5"], 500.5),
    "chunked_prefill_size": (["512"], 512),
    "mixed_batches": ([], False),  # --no-mixed-batches
    "itl_target_ms": (["40"], 40.0),
    "itl_ratio": (["3.5"], 3.5),
    "enable_prefix_cache": ([], False),  # --no-enable-prefix-cache
    "cache_index": (["block-hash"], "block-hash"),
    "eviction_policy": (["lfu"], "lfu"),
    "attention_backend": (["torch"], "torch"),
    "cascade_attention": ([], False),
    "cascade_min_shared": (["128"], 128),
    "dtype": (["bfloat16"], "bfloat16"),
    "device": (["cuda"], "cuda"),
    "quantize": (["int8"], "int8"),
    "seed": (["7"], 7),
    "tune_malloc": ([], False),
    "pack_weights": ([], False),
    "cpu_profile": (["/tmp/profile.json"], "/tmp/profile.json"),
    "disk_cache_dir": (["/tmp/kv"], "/tmp/kv"),
    "disk_cache_size_gb": (["2"], 2.0),
    "host_cache_size_gb": (["1.5"], 1.5),
    "write_policy": (["write_through"], "write_through"),
    "record_trace": (["trace.jsonl"], "trace.jsonl"),
    "grammar_compile_timeout_s": (["2.5"], 2.5),
    "tool_call_parser": (["hermes"], "hermes"),
    "reasoning_parser": (["qwen3"], "qwen3"),
    "speculative": (["ngram"], "ngram"),
    "speculative_tokens": (["3"], 3),
    "check_invariants": ([], True),  # --check-invariants
}


def serve_args(*words: str) -> argparse.Namespace:
    argv = ["serve", *words]
    return build_parser(argv).parse_args(argv)


def serve_flags() -> set[str]:
    parser = build_parser(["serve"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices["serve"]._option_string_actions)


def test_every_field_has_a_serve_flag_and_help():
    flags = serve_flags()
    for f in dataclasses.fields(EngineConfig):
        assert f.metadata.get("help"), f"{f.name}: give it metadata={{'help': ...}}"
        assert set(flags_of()[f.name]) <= flags, f.name
        assert "--" + f.name.replace("_", "-") in flags


def test_the_flags_defaults_are_the_configs():
    assert engine_config(serve_args()) == EngineConfig()
    assert serve_args().page_size == EngineConfig().page_size == 16


def test_each_flag_gives_its_field_in_the_config_built():
    assert sorted(VALUES) == sorted(FIELDS), "give each new field a value to parse here"
    default = EngineConfig()
    for name, (words, value) in VALUES.items():
        flag = "--" + name.replace("_", "-")
        if words == [] and getattr(default, name) is True:
            flag = "--no-" + name.replace("_", "-")
        config = engine_config(serve_args(flag, *words))
        assert getattr(config, name) == value, name
        assert getattr(default, name) != value, name  # the flag changed it
        others = {k: v for k, v in config_options(serve_args(flag, *words)).items() if k != name}
        assert others == {k: getattr(default, k) for k in others}, name


def test_the_old_spellings_still_work():
    config = engine_config(serve_args("--disable-prefix-cache", "--no-mixed-batches"))
    assert config.enable_prefix_cache is False and config.mixed_batches is False
    assert serve_args("--itl-ratio", "0").itl_ratio is None  # no cap, as before
    assert serve_args("--itl-ratio", "none").itl_ratio is None
    assert serve_args("--reasoning-parser", "none").reasoning_parser is None
    assert serve_args("--mixed-batches").mixed_batches is True


def test_engine_options_are_every_field_but_the_model():
    options = engine_options(serve_args("--page-size", "16", "--model", "tiny"))
    assert sorted(options) == sorted(set(FIELDS) - {"model"})
    assert options["page_size"] == 16


def test_a_bad_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        serve_args("--page-size", "sixteen")
    assert "--page-size: invalid int value: 'sixteen'" in capsys.readouterr().err


@dataclasses.dataclass(frozen=True)
class Other:
    sizes: tuple[int, ...] = dataclasses.field(default=(1, 2), metadata={"help": "a list"})
    extra: dict = dataclasses.field(default_factory=dict, metadata={"help": "JSON"})
    limit: int | None = dataclasses.field(default=None, metadata={"help": "maybe"})
    loud: bool = dataclasses.field(default=False, metadata={"help": "on or off"})
    thing: Any = dataclasses.field(default=None, metadata={"help": "a path"})


def test_tuples_are_comma_lists_and_dicts_json():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Other)
    words = ["--sizes", "4, 8,16", "--extra", '{"a": [1]}', "--limit", "3", "--loud"]
    args = parser.parse_args([*words, "--thing", "x.json"])
    assert config_options(args, Other) == {
        "sizes": (4, 8, 16),
        "extra": {"a": [1]},
        "limit": 3,
        "loud": True,
        "thing": "x.json",
    }
    assert config_options(parser.parse_args([]), Other) == dataclasses.asdict(Other())


def test_docs_engine_md_has_the_table_of_the_fields():
    text = DOCS.read_text()
    assert render_docs(text) == text, (
        "docs/engine.md's options table is out of date with EngineConfig: run "
        "python -m radixserve.engine.config_flags --write-docs docs/engine.md"
    )
    for name in FIELDS:
        assert f"| `{name}` |" in text


def test_serve_help_lists_every_field_and_loads_no_torch():
    code = (
        "import sys\n"
        "from radixserve.cli import main\n"
        "try:\n"
        "    main(['serve', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules, 'torch loaded'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    for name in FIELDS:
        assert "--" + name.replace("_", "-") in out.stdout, name
