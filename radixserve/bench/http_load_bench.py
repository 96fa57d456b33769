"""``radixserve bench serve``: the real server under a streamed chat load, configurations side
by side.

The load: streamed chat completions from users who share a few long system prompts, Poisson
arrivals, at most ``concurrency`` streams open. Each configuration is a ``radixserve serve``
child process (or any OpenAI-compatible server given by ``--url``, vLLM's for instance);
configurations alternate round by round. A label names server flags, joined by ``+``:
``mixed`` (the defaults), ``alternating`` (``--no-mixed-batches``), ``off`` (no prefix
cache), ``chunk=N`` (``--chunked-prefill-size``), ``itl=MS`` (``--itl-target-ms``), ``ratio=R``
(``--itl-ratio``; 0: none), ``quantize=Q`` (``--quantize``: none, auto, int8, int4),
``neighbour`` (the load runs beside a busy process, ``common.busy_neighbour``; also after a
``--url-label``), ``fixed-threads`` (the server keeps torch's thread count). Rows
are each figure's median over the rounds; pairs compare each configuration with the first,
round by round. After each run the server audits its cache accounting and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from radixserve.bench import common, http_load
from radixserve.bench.http_load import ChatLoad, ServerProcess, drive, median_row
from radixserve.sim.optimal import optimal_hit_rate
from radixserve.tables import Column, TableSpec, finish, num, pct, plot, times

FLAGS = {"mixed": [], "alternating": ["--no-mixed-batches"], "off": ["--disable-prefix-cache"]}
VALUED = {"chunk": "--chunked-prefill-size", "itl": "--itl-target-ms", "ratio": "--itl-ratio"}
VALUED |= {"page": "--page-size"}  # after the command's own --page-size, so it wins
WORDS = {"quantize": ("--quantize", ("none", "auto", "int8", "int4"))}
NEIGHBOUR = "neighbour"  # not a flag: the load runs beside a busy process
FIXED = "fixed-threads"  # not a flag: RADIXSERVE_ADAPT_THREADS=0 (thread_governor.py)


def server_flags(label: str) -> list[str]:
    """The ``radixserve serve`` flags a configuration label stands for."""
    flags: list[str] = []
    for part in label.split("+"):
        name, _, value = part.partition("=")
        if part in (NEIGHBOUR, FIXED):
            continue
        if part in FLAGS:
            flags += FLAGS[part]
        elif name in VALUED and value:
            float(value)  # a number, or a ValueError naming it
            flags += [VALUED[name], value]
        elif name in WORDS and value in WORDS[name][1]:
            flags += [WORDS[name][0], value]
        else:
            raise ValueError(
                f"unknown configuration part {part!r} in {label!r}: use {sorted(FLAGS)}, "
                f"{'/'.join(f'{k}=N' for k in VALUED)}, quantize=Q, {NEIGHBOUR} or {FIXED}, "
                "joined by '+'"
            )
    return flags


@dataclass(frozen=True)
class ServeBenchConfig:
    model: str = "bench-135m"
    load: ChatLoad = field(default_factory=ChatLoad)
    page_size: int = 16
    configs: tuple[str, ...] = ("mixed", "alternating")
    urls: tuple[tuple[str, str], ...] = ()  # (label, url) of servers this does not start
    url_model: str | None = None  # the model name those servers expect
    rounds: int = 1

    def __post_init__(self) -> None:
        for label in self.configs:
            server_flags(label)
        if not self.configs and not self.urls:
            raise ValueError("give at least one configuration or --url")
        if self.rounds < 1:
            raise ValueError("rounds must be >= 1")

    @property
    def labels(self) -> list[str]:
        return [*self.configs, *(label for label, _ in self.urls)]


def run_one(cfg: ServeBenchConfig, label: str, on_done: Callable[[], None]) -> dict:
    """One round of one configuration: a server of ours (warmed, loaded, audited, stopped
    with SIGTERM) or one at a URL."""
    busy = NEIGHBOUR in label.split("+")
    if url := dict(cfg.urls).get(label):
        flushed = "yes" if http_load.warm_and_flush(url, cfg.url_model) else "no"
        with common.busy_neighbour(busy):
            return drive(url, cfg.load, cfg.url_model, on_done) | {"flushed": flushed}
    args = ["--model", cfg.model, "--page-size", str(cfg.page_size)]
    args += ["--max-running-requests", str(cfg.load.concurrency), "--seed", str(cfg.load.seed)]
    env = {"RADIXSERVE_ADAPT_THREADS": "0"} if FIXED in label.split("+") else None
    with ServerProcess(args + server_flags(label), env=env) as server:
        http_load.warm_and_flush(server.url, None)
        with common.busy_neighbour(busy):
            row = drive(server.url, cfg.load, None, on_done)
        audit = httpx.get(server.url + "/check_invariants", timeout=120.0).json()
        return row | {
            "invariants": "ok" if audit["ok"] else audit["error"],
            "shutdown": "graceful" if server.stop() else "FAILED",
        }


def run_serve_bench(cfg: ServeBenchConfig, on_done: Callable[[], None]) -> dict:
    """Rows (medians over rounds), pairs against the first configuration, the optimal."""
    from radixserve.model.loader import load_tokenizer

    rounds = common.run_rounds(cfg.labels, cfg.rounds, lambda label: run_one(cfg, label, on_done))
    # the token ids the server's chat template makes of each chat, with the model's tokenizer
    tokenizer = load_tokenizer(cfg.model)
    texts = [
        tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        for chat in cfg.load.chats()
    ]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]

    optimal = optimal_hit_rate(((p, None) for p in ids), cfg.page_size)  # any page size
    rows = [
        median_row(label, runs) | {"optimal_hit_rate": optimal} for label, runs in rounds.items()
    ]
    first = rounds[cfg.labels[0]]
    pairs = []
    for label in cfg.labels[1:]:
        pair = {"config": label, "versus": cfg.labels[0]}
        for key in ("itl_p99_ms", "ttft_p99_ms", "req_s"):
            pair |= common.paired(key, rounds[label], first, key)
        pairs.append(pair)
    return {"rows": rows, "pairs": pairs, "optimal_hit_rate": optimal}


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
        ),
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    helps = {
        "configs": "labels: mixed, alternating, off, chunk=N, itl=MS, ratio=R, quantize=Q, "
        "neighbour, fixed-threads, joined by '+'",
        "url_model": "the model name --url servers expect",
    }
    common.add_options(p, ServeBenchConfig, "page_size configs rounds url_model", True, **helps)
    names = "requests concurrency request_rate max_tokens system_prompts seed"
    common.add_fields(p, ChatLoad, names, request_rate="req/s, Poisson; inf: at once")
    p.add_argument("--url", action="append", default=[], help="also load this server")
    p.add_argument("--url-label", action="append", default=[], help="its label (per --url)")


def run(args: argparse.Namespace) -> int:
    load = common.configure(ChatLoad, args, {"requests": 8, "max_tokens": 4})
    labels = args.url_label + [f"url{i}" for i in range(len(args.url_label), len(args.url))]
    urls = tuple(zip(labels, args.url, strict=True))
    cfg = common.configure(ServeBenchConfig, args, {"model": "tiny"}, load=load, urls=urls)
    total = load.requests * len(cfg.labels) * cfg.rounds
    data = common.with_progress(
        "bench serve", total, lambda step: run_serve_bench(cfg, lambda: step("bench serve"))
    )
    rate = "all at once" if load.request_rate == float("inf") else f"{load.request_rate:g} req/s"
    print(
        f"{cfg.model} over HTTP: {load.requests} streamed chats under {load.system_prompts} "
        f"system prompts, {rate}, {load.max_tokens} tokens each, {cfg.rounds} round(s); "
        f"optimal hit rate {data['optimal_hit_rate']:.1%}"
    )

    def chart(path: str) -> None:  # the prefill budget's trade: ITL against TTFT
        plot(path, data["rows"], "ttft_p99_ms", ["itl_p99_ms"], "config", logx=True, logy=True)

    failed = finish(args, cfg, data, TABLES, chart)
    for r in data["rows"]:
        if r["errors"] or r.get("invariants", "ok") != "ok" or r.get("shutdown") == "FAILED":
            why = r["first_error"] or f"invariants {r['invariants']}, shutdown {r['shutdown']}"
            print(f"{r['config']}: failed: {why}")
            failed = 1
    return failed
