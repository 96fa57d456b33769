"""``radixserve bench report``: regenerate ``docs/benchmarks.md`` from the benchmarks' JSON.

Each section is the command that produced it, its tables rendered from ``docs/bench_*.json``
with the benchmark's own column registry, and its chart, woven into the hand-written reading
in ``docs/notes/<section>.md`` (a ``<!-- table -->`` line there marks where the tables go).
Targets and what the figures mean live in those readings, not here.
"""

from __future__ import annotations

import argparse
import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from radixserve.bench.report import machine, markdown_table

TABLE_MARK = "<!-- table -->"
SERVING = "radixserve.bench.serving_bench"
SERVE = "radixserve.bench.serve_bench"


@dataclass(frozen=True)
class Section:
    key: str  # docs/bench_<key>.json and docs/notes/<key>.md
    title: str
    command: str | None
    module: str | None = None  # whose TABLES render the JSON
    image: str | None = None
    wide: bool = False  # every column, not the narrow set the terminal shows


SECTIONS = (
    Section("demo", "The end-to-end demo — `radixserve demo`", None),
    Section(
        "serving",
        "Serving workloads — `radixserve bench serving`",
        "radixserve bench serving --rounds 3 --sweep multi-turn-chat tree-of-thought rag "
        "--json docs/bench_serving.json --plot docs/bench_serving.png",
        SERVING,
        "bench_serving.png",
    ),
    Section(
        "serving_vllm",
        "Against vLLM — `radixserve bench serving --configs radix-lpm vllm`",
        "radixserve bench serving --workload few-shot shared-system-prompt multi-turn-chat rag "
        "--configs radix-lpm vllm --vllm-python PEER_VENV/bin/python --rounds 3 "
        "--json docs/bench_serving_vllm.json",
        SERVING,
    ),
    Section(
        "speed",
        "Issue 20's workload against vLLM, cold and warm — `radixserve bench serving`",
        "radixserve bench serving --workload long-prefix --configs radix-lpm vllm "
        "--vllm-python PEER_VENV/bin/python --max-tokens 32 --rounds 3 [--warm] "
        "[--dtype bfloat16] --json docs/bench_speed.json",
        SERVING,
    ),
    Section(
        "zen4",
        "Issue 20's workloads on a Zen 4 EPYC — `radixserve bench serving`",
        "radixserve bench serving --workload long-prefix --configs radix-lpm vllm "
        "--vllm-python PEER_VENV/bin/python --max-tokens 32 --rounds 3 [--warm] "
        "[--dtype bfloat16]; radixserve bench serving --workload few-shot "
        "shared-system-prompt multi-turn-chat rag --configs radix-lpm vllm "
        "--vllm-python PEER_VENV/bin/python --rounds 3 (merged: docs/bench_zen4.json)",
        SERVING,
    ),
    Section(
        "serving_native",
        "Native against torch attention, end to end — `radixserve bench serving`",
        "radixserve bench serving --workload shared-system-prompt --configs radix-lpm "
        "radix-lpm-torch --max-tokens 16 --rounds 3 --json docs/bench_serving_native.json",
        SERVING,
        wide=True,  # its point is the decode column
    ),
    Section(
        "serve",
        "The HTTP server under load, mixed steps against alternating — `radixserve bench serve`",
        "radixserve bench serve --configs mixed alternating --url http://127.0.0.1:PORT "
        "--url-label vllm --url-model PEER_DIR --rounds 3 --json docs/bench_serve.json",
        SERVE,
    ),
    Section(
        "serve_frontier",
        "The prefill budget's trade, ITL against TTFT — `radixserve bench serve`",
        "radixserve bench serve --configs mixed alternating chunk=1024 chunk=512 chunk=256 "
        "chunk=128 itl=200 itl=100 itl=75 --url http://127.0.0.1:PORT --url-label vllm "
        "--url-model PEER_DIR --rounds 2 --json docs/bench_serve_frontier.json "
        "--plot docs/bench_serve_frontier.png",
        SERVE,
        "bench_serve_frontier.png",
    ),
    Section(
        "serve_burst",
        "A burst: every request at once — `radixserve bench serve`",
        "radixserve bench serve --requests 128 --request-rate inf --max-tokens 16 "
        "--configs mixed alternating mixed+off alternating+off --json docs/bench_serve_burst.json",
        SERVE,
    ),
    Section(
        "lang",
        "DSL programs — `radixserve bench lang`",
        "radixserve bench lang --json docs/bench_lang.json",
        "radixserve.bench.lang_bench",
    ),
    Section(
        "structured",
        "Structured output — `radixserve bench structured`",
        "radixserve bench structured --rounds 3 --json docs/bench_structured.json "
        "--plot docs/bench_structured.png",
        "radixserve.bench.structured_bench",
        "bench_structured.png",
        wide=True,
    ),
    Section(
        "tiers",
        "The host and disk tiers — `radixserve bench tiers`",
        "radixserve bench tiers --json docs/bench_tiers.json",
        "radixserve.bench.tiers_bench",
    ),
    Section(
        "cluster",
        "Replicas on Ray Serve, routed — `radixserve bench cluster`",
        "radixserve bench cluster --json docs/bench_cluster.json --plot docs/bench_cluster.png",
        "radixserve.bench.cluster_bench",
        "bench_cluster.png",
    ),
    Section(
        "simulate",
        "Sizing the cache offline — `radixserve simulate`",
        "python tools/synthetic_trace.py --requests 20000 --out trace.jsonl && "
        "radixserve simulate trace.jsonl --page-size 16 --capacity-tokens 50000 100000 "
        "200000 400000 800000 1600000 --policy lru lfu belady "
        "--json docs/bench_simulate.json --plot docs/bench_simulate.png",
        "radixserve.sim.simulate",
        "bench_simulate.png",
        wide=True,
    ),
    Section(
        "cache",
        "Radix tree operations — `radixserve bench cache`",
        "radixserve bench cache --json docs/bench_cache.json --plot docs/bench_cache.png",
        "radixserve.bench.cache_bench",
        "bench_cache.png",
    ),
    Section(
        "kernels",
        "Native kernels — `radixserve bench kernels`",
        "radixserve bench kernels --reps 9 --json docs/bench_kernels.json "
        "--plot docs/bench_kernels.png",
        "radixserve.bench.kernel_bench",
        "bench_kernels.png",
    ),
    Section(
        "model",
        "Model forward — `radixserve bench model`",
        "radixserve bench model --json docs/bench_model.json",
        "radixserve.bench.model_bench",
    ),
)


def tables(section: Section, data: dict) -> str:
    specs = importlib.import_module(section.module).TABLES
    parts = []
    for i, spec in enumerate(specs):
        if data.get(spec.key):
            table = markdown_table(data[spec.key], spec.columns, section.wide)
            title = spec.title[0].upper() + spec.title[1:]
            parts.append(table if i == 0 else f"### {title}\n\n{table}")
    if "measured" in data:
        cpu = data.get("machine", {}).get("cpu")
        parts.append(f"(Measured {data['measured']}" + (f" on {cpu}.)" if cpu else ".)"))
    return "\n\n".join(parts)


def render(docs: Path) -> str:
    m = machine()
    out = [
        "# Benchmarks",
        "",
        "Generated by `radixserve bench report` from `docs/bench_*.json` and the readings in "
        "`docs/notes/`. Regenerate a section by rerunning its command, then the report.",
        "",
        f"Machines: {m['cores']} cores, {m['memory']}, Python {m['python']}, torch "
        f"{m['torch']} ({m['torch_threads']} threads), no GPU; shared VMs whose CPU differs "
        "from one to the next (an Intel Xeon with AVX-512 and AMX, AMD EPYCs of Zen 5 and of "
        "Zen 4 with AVX-512 and AVX512_BF16 but no AMX, AVX2-only ones), so each section "
        "names the one it was measured on. Identical runs differ by up to ~25% from one "
        "round to the next, so comparisons are side by side in one run, alternating, as "
        "the median of paired rounds' ratios and their min-max.",
    ]
    for section in SECTIONS:
        out += ["", f"## {section.title}", ""]
        if section.command:
            out += ["```bash", section.command, "```", ""]
        note = docs / "notes" / f"{section.key}.md"
        text = note.read_text().strip() if note.exists() else TABLE_MARK
        if section.module:
            path = docs / f"bench_{section.key}.json"
            table = "(not measured yet: run the command above)"
            if path.exists():
                table = tables(section, json.loads(path.read_text()))
            text = text.replace(TABLE_MARK, table) if TABLE_MARK in text else table + "\n\n" + text
        out.append(text)
        if section.image and (docs / section.image).exists():
            out += ["", f"![{section.key}]({section.image})"]
    return "\n".join(out) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--docs", default="docs", help="the folder with bench_*.json and notes/")


def run(args: argparse.Namespace) -> int:
    path = Path(args.docs) / "benchmarks.md"
    path.write_text(render(Path(args.docs)))
    print(f"wrote {path}")
    return 0
