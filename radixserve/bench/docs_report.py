"""``radixserve bench report``: regenerate ``docs/benchmarks.md`` from the benchmarks' JSON.

Each section is the command that produced it, its tables rendered from ``docs/bench_*.json``
and its chart, woven into the hand-written reading in ``docs/notes/<section>.md`` (a
``<!-- table -->`` line there marks where the generated table goes).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from radixserve.bench.serving_bench import check_targets

Fmt = Callable[[object], str]
TABLE_MARK = "<!-- table -->"


def _num(digits: int = 1) -> Fmt:
    return lambda v: "" if v is None else f"{v:,.{digits}f}"


def _pct(v: object) -> str:
    return "" if v is None else f"{v:.1%}"


def _times(v: object) -> str:
    return "" if v is None else f"{v:.2f}x"


def _rounds(v: object) -> str:
    return "" if not v else " / ".join(f"{x:.2f}" for x in v)


def _ms(v: object) -> str:
    return "" if v is None else f"{1000 * v:.0f}"


def _rounds_ms(v: object) -> str:
    return "" if not v else " / ".join(_ms(x) for x in v)


def _plain(v: object) -> str:
    return "" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    command: str | None
    columns: tuple[tuple[str, str, Fmt], ...] = ()
    rows_key: str = "rows"
    image: str | None = None
    extra: tuple[tuple[str, str, tuple[tuple[str, str, Fmt], ...]], ...] = ()  # more tables
    # judges the stored rows against the targets afresh, so a sharper rule applies to
    # every run on record rather than to the next one only
    judge: Callable[[dict], list[dict]] | None = None


def _judge_serving(data: dict) -> list[dict]:
    return check_targets(data["rows"], data.get("sweep", ()))


SERVING_COLUMNS = (
    ("workload", "workload", _plain),
    ("config", "configuration", _plain),
    ("req_s", "req/s", _num(2)),
    ("tok_s", "tok/s", _num(0)),
    ("ttft_p50_s", "TTFT p50 s", _num(2)),
    ("ttft_p99_s", "TTFT p99 s", _num(2)),
    ("e2e_p50_s", "e2e p50 s", _num(2)),
    ("hit_rate", "hit rate", _pct),
    ("of_optimal", "of optimal", _pct),
    ("prefill_tokens", "prefilled", _plain),
    ("dedup_ratio", "dedup", _num(2)),
    ("sched_ms_per_step", "sched ms/step", _num(2)),
    ("engine_seconds", "engine ms", _ms),
    ("lookup_p50_us", "lookup p50 µs", _num(1)),
    ("lookup_p99_us", "p99 µs", _num(1)),
    ("ttft_reduction", "TTFT cut", _pct),
    ("seed_model_ttft_reduction", "model 1-((L-P)/L)²", _pct),
    ("speedup_vs_off", "vs off", _times),
)

SERVING_TARGET_COLUMNS = (
    ("target", "target", _plain),
    ("workload", "workload", _plain),
    ("measured", "measured", _num(2)),
    ("goal", "goal", _num(2)),
    ("met", "met", _plain),
    ("rounds", "paired rounds (range; 95% interval)", _plain),
)

# every round of a configuration, for runs judged round by round
SERVING_ROUND_COLUMNS = (
    ("workload", "workload", _plain),
    ("config", "configuration", _plain),
    ("round_seconds", "seconds per round", _rounds),
    ("round_engine_seconds", "engine ms per round", _rounds_ms),
    ("batches", "batches (hash)", _plain),
)
SERVING_TARGETS_TABLE = ("targets", "Against the targets", SERVING_TARGET_COLUMNS)

SECTIONS = (
    Section("demo", "The end-to-end demo — `radixserve demo`", None),
    Section(
        "serving",
        "Serving workloads — `radixserve bench serving`",
        "radixserve bench serving --rounds 3 --sweep multi-turn-chat tree-of-thought rag "
        "--json docs/bench_serving.json --plot docs/bench_serving.png",
        SERVING_COLUMNS,
        image="bench_serving.png",
        judge=_judge_serving,
        extra=(
            SERVING_TARGETS_TABLE,
            (
                "sweep",
                "KV-pool sweep",
                (
                    ("workload", "workload", _plain),
                    ("kv_tokens", "KV pool tokens", _plain),
                    ("config", "configuration", _plain),
                    ("hit_rate", "hit rate", _pct),
                    ("req_s", "req/s", _num(2)),
                ),
            ),
        ),
    ),
    Section(
        "serving_pairs",
        "Radix against block-hash, round by round — `radixserve bench serving --rounds 4`",
        "radixserve bench serving --configs radix-lpm radix-fcfs block-hash-fcfs --rounds 4 "
        "--json docs/bench_serving_pairs.json",
        (
            *SERVING_ROUND_COLUMNS,
            ("req_s", "req/s (best)", _num(2)),
            ("hit_rate", "hit rate", _pct),
            ("prefill_tokens", "prefilled", _plain),
            ("sched_ms_per_step", "sched ms/step", _num(2)),
            ("lookup_p50_us", "lookup p50 µs", _num(1)),
        ),
        extra=(SERVING_TARGETS_TABLE,),
        judge=_judge_serving,
    ),
    Section(
        "serving_rag",
        "rag, radix against block-hash over ten rounds — `radixserve bench serving --rounds 10`",
        "radixserve bench serving --workload rag --configs radix-lpm block-hash-fcfs "
        "--rounds 10 --json docs/bench_serving_rag.json",
        (
            *SERVING_ROUND_COLUMNS,
            ("hit_rate", "hit rate", _pct),
            ("prefill_tokens", "prefilled", _plain),
        ),
        extra=(SERVING_TARGETS_TABLE,),
        judge=_judge_serving,
    ),
    Section(
        "serving_vllm",
        "Against vLLM — `radixserve bench serving --configs radix-lpm vllm`",
        "radixserve bench serving --workload few-shot shared-system-prompt multi-turn-chat rag "
        "--configs radix-lpm vllm --vllm-python PEER_VENV/bin/python "
        "--json docs/bench_serving_vllm.json",
        (
            ("workload", "workload", _plain),
            ("config", "configuration", _plain),
            ("req_s", "req/s", _num(2)),
            ("tok_s", "tok/s", _num(0)),
            ("hit_rate", "hit rate", _pct),
            ("prefill_tokens", "prefilled", _plain),
        ),
    ),
    Section(
        "serve",
        "The HTTP server under load — `radixserve bench serve`",
        "radixserve bench serve --json docs/bench_serve.json",
        (
            ("config", "prefix cache", _plain),
            ("errors", "errors", _plain),
            ("req_s", "req/s", _num(2)),
            ("ttft_p50_ms", "TTFT p50 ms", _num(0)),
            ("ttft_p99_ms", "TTFT p99 ms", _num(0)),
            ("itl_p50_ms", "ITL p50 ms", _num(0)),
            ("itl_p99_ms", "ITL p99 ms", _num(0)),
            ("hit_rate", "hit rate", _pct),
            ("speedup", "speedup", _times),
            ("invariants", "invariants", _plain),
            ("shutdown", "SIGTERM", _plain),
        ),
    ),
    Section(
        "lang",
        "DSL programs — `radixserve bench lang`",
        "radixserve bench lang --json docs/bench_lang.json",
        (
            ("program", "program", _plain),
            ("cache", "cache", _plain),
            ("calls", "calls", _plain),
            ("prompt_tokens", "prompt tokens", _plain),
            ("programs_s", "programs/s", _num(2)),
            ("speedup", "speedup", _times),
            ("hit_rate", "hit rate", _pct),
            ("optimal_hit_rate", "optimal", _pct),
            ("of_optimal", "of optimal", _pct),
        ),
    ),
    Section(
        "cache",
        "Radix tree operations — `radixserve bench cache`",
        "radixserve bench cache --json docs/bench_cache.json --plot docs/bench_cache.png",
        (
            ("page_size", "page", _plain),
            ("group", "tree", _plain),
            ("tree_tokens", "cached tokens", _plain),
            ("hit_len", "tokens/op", _plain),
            ("op", "op", _plain),
            ("p50_us", "p50 µs", _num(1)),
            ("p99_us", "p99 µs", _num(1)),
        ),
        image="bench_cache.png",
    ),
    Section(
        "kernels",
        "Native kernels — `radixserve bench kernels`",
        "radixserve bench kernels --reps 9 --json docs/bench_kernels.json "
        "--plot docs/bench_kernels.png",
        (
            ("kernel", "kernel", _plain),
            ("dtype", "dtype", _plain),
            ("case", "batch x context", _plain),
            ("torch_ms", "torch ms", _num(2)),
            ("plain_ms", "plain native ms", _num(2)),
            ("native_ms", "native ms", _num(2)),
            ("speedup", "speedup", _times),
            ("limit_ms", "copy limit ms", _num(2)),
            ("of_limit", "x copy limit", _num(2)),
            ("read_limit_ms", "read limit ms", _num(2)),
            ("of_read_limit", "x read limit", _num(2)),
            ("bandwidth_gb_s", "copy GB/s", _num(1)),
            ("read_gb_s", "read GB/s", _num(1)),
            ("gemm_ms", "dense GEMM ms", _num(2)),
            ("gemm_ceiling", "plain / GEMM", _times),
        ),
        image="bench_kernels.png",
        extra=(
            (
                "linear",
                "Linear layers at a few rows (a decode step's projections, every layer)",
                (
                    ("dtype", "dtype", _plain),
                    ("case", "case", _plain),
                    ("weight_mb", "weights MB", _num(0)),
                    ("torch_ms", "F.linear ms", _num(1)),
                    ("weight_first_ms", "weight-first ms", _num(1)),
                    ("native_ms", "native ms", _num(1)),
                    ("speedup", "speedup", _times),
                    ("gflop_s", "native GFLOP/s", _num(1)),
                    ("read_limit_ms", "read limit ms", _num(1)),
                    ("of_read_limit", "x read limit", _num(2)),
                ),
            ),
            (
                "matcher",
                "The radix tree's walk, p50",
                (
                    ("case", "case", _plain),
                    ("python_walk_us", "Python walk µs", _num(1)),
                    ("native_walk_us", "with the native scan µs", _num(1)),
                    ("cold_key_walk_us", "native, key cold µs", _num(1)),
                    ("match_prefix_us", "whole match_prefix µs", _num(1)),
                ),
            ),
            (
                "targets",
                "Against the targets",
                (
                    ("target", "target", _plain),
                    ("value", "measured", _num(2)),
                    ("goal", "goal", _plain),
                    ("met", "met", _plain),
                ),
            ),
        ),
    ),
    Section(
        "serving_native",
        "Native against torch attention, end to end — `radixserve bench serving`",
        "radixserve bench serving --workload shared-system-prompt --configs radix-lpm "
        "radix-lpm-torch --max-tokens 16 --rounds 3 --json docs/bench_serving_native.json",
        (
            ("workload", "workload", _plain),
            ("config", "configuration", _plain),
            ("requests", "requests", _plain),
            ("req_s", "req/s", _num(2)),
            ("decode_tok_s", "decode tok/s", _num(1)),
            ("ttft_p50_s", "TTFT p50 s", _num(2)),
            ("e2e_p50_s", "e2e p50 s", _num(2)),
            ("hit_rate", "hit rate", _pct),
        ),
        extra=(SERVING_TARGETS_TABLE,),
        judge=_judge_serving,
    ),
    Section(
        "model",
        "Model forward — `radixserve bench model`",
        "radixserve bench model --json docs/bench_model.json",
        (
            ("dtype", "dtype", _plain),
            ("case", "case", _plain),
            ("attention", "attention", _plain),
            ("ours_tok_s", "radixserve tok/s", _num(1)),
            ("transformers_tok_s", "transformers tok/s", _num(1)),
            ("ratio", "ratio", _num(2)),
        ),
    ),
)


def markdown_table(rows: list[dict], columns: tuple[tuple[str, str, Fmt], ...]) -> str:
    present = [c for c in columns if any(c[0] in r for r in rows)]
    head = "| " + " | ".join(h for _, h, _ in present) + " |"

    def numeric(key: str) -> bool:
        return any(isinstance(r.get(key), int | float) for r in rows)

    align = "|" + "|".join("---:" if numeric(k) else "---" for k, _, _ in present) + "|"
    body = ["| " + " | ".join(f(r.get(k)) for k, _, f in present) + " |" for r in rows]
    return "\n".join([head, align, *body])


def machine() -> dict:
    """Where a benchmark ran; stored in each JSON it writes."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = f"{pages / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def render(docs: Path) -> str:
    m = machine()
    out = [
        "# Benchmarks",
        "",
        "Generated by `radixserve bench report` from `docs/bench_*.json` and the readings in "
        "`docs/notes/`. Regenerate a section by rerunning its command, then the report.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, Python {m['python']}, "
        f"torch {m['torch']} ({m['torch_threads']} threads), no GPU. It is a shared VM: the "
        "same code can run up to 2x slower from one run to the next, so comparisons are "
        "measured side by side in one run, alternating configurations.",
    ]
    for section in SECTIONS:
        out += ["", f"## {section.title}", ""]
        if section.command:
            out += ["```bash", section.command, "```", ""]
        note = docs / "notes" / f"{section.key}.md"
        text = note.read_text().strip() if note.exists() else TABLE_MARK
        data_path = docs / f"bench_{section.key}.json"
        table = "(not measured yet: run the command above)"
        if section.columns and data_path.exists():
            data = json.loads(data_path.read_text())
            if section.judge:
                data["targets"] = section.judge(data)
            table = markdown_table(data[section.rows_key], section.columns)
            if "measured" in data:
                table += f"\n\n(Measured {data['measured']}.)"
            for key, title, columns in section.extra:
                if data.get(key):
                    table += f"\n\n### {title}\n\n" + markdown_table(data[key], columns)
        if section.columns:
            text = text.replace(TABLE_MARK, table) if TABLE_MARK in text else table + "\n\n" + text
        out.append(text)
        if section.image and (docs / section.image).exists():
            out += ["", f"![{section.key}]({section.image})"]
    return "\n".join(out) + "\n"


def write_report(docs: str | Path = "docs") -> Path:
    docs = Path(docs)
    path = docs / "benchmarks.md"
    path.write_text(render(docs))
    return path
