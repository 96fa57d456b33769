"""``radixserve bench serve``: the real server under a streamed chat load, configurations side
by side.

Each configuration is a ``radixserve serve`` process (or any OpenAI-compatible server given by
``--url``, vLLM's for instance) driven by the same load (``serve_load``); configurations
alternate round by round. A label names server flags, joined by ``+``: ``mixed`` (the
defaults), ``alternating`` (``--no-mixed-batches``), ``off`` (no prefix cache), ``chunk=N``
(``--chunked-prefill-size``), ``itl=MS`` (``--itl-target-ms``). Rows are each figure's
median over the rounds; pairs compare each configuration with the first, round by round.
After each run the server audits its cache accounting and stops on SIGTERM, cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median

import httpx

from radixserve.bench import plots
from radixserve.bench.report import (
    Column,
    TableSpec,
    finish,
    num,
    pct,
    times,
)
from radixserve.bench.serve_load import ChatLoad, chat_prompt_ids, drive, summarize
from radixserve.bench.server_process import ServerProcess
from radixserve.bench.timing import alternating, paired
from radixserve.bench.workloads import optimal_hit_rate

FLAGS = {"mixed": [], "alternating": ["--no-mixed-batches"], "off": ["--disable-prefix-cache"]}
VALUED = {"chunk": "--chunked-prefill-size", "itl": "--itl-target-ms"}


def server_flags(label: str) -> list[str]:
    """The ``radixserve serve`` flags a configuration label stands for."""
    flags: list[str] = []
    for part in label.split("+"):
        name, _, value = part.partition("=")
        if part in FLAGS:
            flags += FLAGS[part]
        elif name in VALUED and value:
            float(value)  # a number, or a ValueError naming it
            flags += [VALUED[name], value]
        else:
            raise ValueError(
                f"unknown configuration part {part!r} in {label!r}: use {sorted(FLAGS)} or "
                f"{'/'.join(f'{k}=N' for k in VALUED)}, joined by '+'"
            )
    return flags


@dataclass(frozen=True)
class External:
    """A server this benchmark does not start: loaded at ``url``, asked for ``model``."""

    label: str
    url: str
    model: str | None = None


@dataclass(frozen=True)
class ServeBenchConfig:
    model: str = "bench-135m"
    load: ChatLoad = field(default_factory=ChatLoad)
    page_size: int = 16
    configs: tuple[str, ...] = ("mixed", "alternating")
    external: tuple[External, ...] = ()
    rounds: int = 1

    def __post_init__(self) -> None:
        for label in self.configs:
            server_flags(label)
        if not self.configs and not self.external:
            raise ValueError("give at least one configuration or --url")
        if self.rounds < 1:
            raise ValueError("rounds must be >= 1")

    @property
    def labels(self) -> list[str]:
        return [*self.configs, *(e.label for e in self.external)]


# Where servers empty their prefix cache: ours and SGLang's, vLLM's (with
# VLLM_SERVER_DEV_MODE=1).
FLUSH_ROUTES = ("/flush_cache", "/reset_prefix_cache")


def warm_and_flush(url: str, model: str | None) -> bool:
    """One short request (first-call costs, compilation, stay out of the figures), then an
    empty prefix cache, so every round starts cold; False when no flush route answered."""
    warm = {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2}
    if model is not None:
        warm["model"] = model
    httpx.post(url + "/v1/chat/completions", json=warm, timeout=300.0).raise_for_status()
    return any(httpx.post(url + r, timeout=60.0).status_code == 200 for r in FLUSH_ROUTES)


def run_local(cfg: ServeBenchConfig, label: str, on_done: Callable[[], None]) -> dict:
    """One server process: warm it, drive the load, audit invariants, stop it with SIGTERM."""
    args = ["--model", cfg.model, "--page-size", str(cfg.page_size)]
    args += ["--max-running-requests", str(cfg.load.concurrency), "--seed", str(cfg.load.seed)]
    with ServerProcess(args + server_flags(label)) as server:
        warm_and_flush(server.url, None)
        records, seconds = asyncio.run(drive(server.url, cfg.load, None, on_done))
        audit = httpx.get(server.url + "/check_invariants", timeout=120.0).json()
        t0 = time.perf_counter()
        graceful = server.stop()
        row = summarize(records, seconds)
        row["invariants"] = "ok" if audit["ok"] else audit["error"]
        row["shutdown"] = "graceful" if graceful else "FAILED"
        row["shutdown_s"] = time.perf_counter() - t0
        return row


def run_external(cfg: ServeBenchConfig, ext: External, on_done: Callable[[], None]) -> dict:
    flushed = warm_and_flush(ext.url, ext.model)
    records, seconds = asyncio.run(drive(ext.url, cfg.load, ext.model, on_done))
    return {**summarize(records, seconds), "flushed": "yes" if flushed else "no"}


def run_serve_bench(cfg: ServeBenchConfig, on_done: Callable[[], None]) -> dict:
    """Rows (medians over rounds), pairs against the first configuration, the optimal."""
    external = {e.label: e for e in cfg.external}
    rounds: dict[str, list[dict]] = {label: [] for label in cfg.labels}
    for label in alternating(cfg.labels, cfg.rounds):
        if label in external:
            rounds[label].append(run_external(cfg, external[label], on_done))
        else:
            rounds[label].append(run_local(cfg, label, on_done))
    ids = chat_prompt_ids(cfg.model, cfg.load.chats())
    optimal = optimal_hit_rate(((p, None) for p in ids), cfg.page_size)
    rows = [_median_row(label, rs, optimal) for label, rs in rounds.items()]
    first = cfg.labels[0]
    pairs = [_pair(first, label, rounds[first], rounds[label]) for label in cfg.labels[1:]]
    return {"rows": rows, "pairs": pairs, "optimal_hit_rate": optimal}


def _median_row(label: str, rounds: list[dict], optimal: float) -> dict:
    row = {"config": label, "rounds": len(rounds), "optimal_hit_rate": optimal}
    for key, value in rounds[0].items():
        if isinstance(value, int | float):
            row[key] = median(r[key] for r in rounds)
        else:  # a failure in any round is the row's
            row[key] = next((r[key] for r in rounds if r[key] != value), value)
    row["errors"] = sum(r["errors"] for r in rounds)
    row["first_error"] = next((r["first_error"] for r in rounds if r["first_error"]), "")
    return row


def _pair(first: str, label: str, base: list[dict], other: list[dict]) -> dict:
    """``label`` over ``first``, round by round: ITL and TTFT p99, requests/s."""
    row = {"config": label, "versus": first}
    for key in ("itl_p99_ms", "ttft_p99_ms", "req_s"):
        ratio = paired([r[key] for r in other], [r[key] for r in base])
        row |= {key: ratio["median"], f"{key}_min": ratio["min"], f"{key}_max": ratio["max"]}
    return row


TABLES = (
    TableSpec(
        "rows",
        "the HTTP server under load (medians over rounds; latencies in ms)",
        (
            Column("config", "config"),
            Column("req_s", "req/s", num(2)),
            Column("ttft_p50_ms", "TTFT p50", num(0)),
            Column("ttft_p99_ms", "TTFT p99", num(0)),
            Column("itl_p50_ms", "ITL p50", num(0)),
            Column("itl_p99_ms", "ITL p99", num(0)),
            Column("hit_rate", "hit", pct),
            Column("optimal_hit_rate", "optimal", pct, wide=True),
            Column("out_tok_s", "tok/s", num(1), wide=True),
            Column("errors", "errors", wide=True),
            Column("invariants", "invariants", wide=True),
            Column("shutdown", "SIGTERM", wide=True),
            Column("flushed", "cold start", wide=True),
        ),
    ),
    TableSpec(
        "pairs",
        "each configuration over the first, paired by round: median, min, max",
        (
            Column("config", "config"),
            Column("versus", "versus", wide=True),
            Column("itl_p99_ms", "ITL p99", times),
            Column("itl_p99_ms_min", "min", times),
            Column("itl_p99_ms_max", "max", times),
            Column("ttft_p99_ms", "TTFT p99", times),
            Column("req_s", "req/s", times),
            Column("ttft_p99_ms_min", "TTFT min", times, wide=True),
            Column("ttft_p99_ms_max", "TTFT max", times, wide=True),
            Column("req_s_min", "req/s min", times, wide=True),
            Column("req_s_max", "req/s max", times, wide=True),
        ),
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ChatLoad()
    p.add_argument("--model", default="bench-135m", help="any model argument (docs/models.md)")
    p.add_argument("--requests", type=int, default=d.requests)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument(
        "--request-rate", type=float, default=d.request_rate, help="req/s, Poisson; inf: at once"
    )
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--system-prompts", type=int, default=d.system_prompts)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument(
        "--configs",
        nargs="*",
        default=["mixed", "alternating"],
        help="labels: mixed, alternating, off, chunk=N, itl=MS, joined by '+'",
    )
    p.add_argument("--url", action="append", default=[], help="also load this server")
    p.add_argument("--url-label", action="append", default=[], help="its label (per --url)")
    p.add_argument("--url-model", default=None, help="the model name --url servers expect")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", help="PNG: ITL p99 against TTFT p99, a point per configuration")


def run(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    labels = args.url_label + [f"url{i}" for i in range(len(args.url_label), len(args.url))]
    cfg = ServeBenchConfig(
        model=args.model,
        load=ChatLoad(
            requests=args.requests,
            concurrency=args.concurrency,
            request_rate=args.request_rate,
            max_tokens=args.max_tokens,
            system_prompts=args.system_prompts,
            seed=args.seed,
        ),
        page_size=args.page_size,
        configs=tuple(args.configs),
        external=tuple(
            External(label, url, args.url_model)
            for label, url in zip(labels, args.url, strict=True)
        ),
        rounds=args.rounds,
    )
    load = cfg.load
    with Progress(transient=True) as progress:
        task = progress.add_task("bench serve", total=load.requests * len(cfg.labels) * cfg.rounds)
        data = run_serve_bench(cfg, lambda: progress.advance(task))
    rate = "all at once" if load.request_rate == float("inf") else f"{load.request_rate:g} req/s"
    print(
        f"{cfg.model} over HTTP: {load.requests} streamed chats under {load.system_prompts} "
        f"system prompts, {rate}, {load.max_tokens} tokens each, {cfg.rounds} round(s); "
        f"optimal hit rate {data['optimal_hit_rate']:.1%}"
    )
    if finish(args, cfg, data, TABLES, lambda path: plots.plot_serve_frontier(data["rows"], path)):
        return 1
    failed = [
        r
        for r in data["rows"]
        if r["errors"] or r.get("invariants", "ok") != "ok" or r.get("shutdown") == "FAILED"
    ]
    for r in failed:
        why = r["first_error"] or f"invariants {r.get('invariants')}, shutdown {r['shutdown']}"
        print(f"{r['config']}: failed: {why}")
    return 1 if failed else 0
