"""``radixserve bench serve``: a bounded load check of the real server over loopback.

A ``radixserve serve`` process is started per configuration and driven by an async HTTP
client: streamed chat completions from many users who share a few long system prompts,
arriving at a fixed rate (Poisson) with at most ``concurrency`` streams open. Afterwards the
server audits its cache accounting and is stopped with SIGTERM, which must exit cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np

from radixserve.bench.report import Column, TableSpec, num, pct, print_tables, times, write_json
from radixserve.bench.server_process import ServerProcess
from radixserve.model.tokenizer import _corpus


@dataclass(frozen=True)
class ServeBenchConfig:
    model: str = "bench-135m"
    requests: int = 128
    concurrency: int = 64
    request_rate: float = float("inf")  # requests per second; inf sends all at once
    max_tokens: int = 16
    system_prompts: int = 4
    system_sentences: int = 24
    page_size: int = 16
    configs: tuple[str, ...] = ("radix", "off")  # prefix cache on, off
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests < 1 or self.concurrency < 1 or self.max_tokens < 1:
            raise ValueError("requests, concurrency and max_tokens must be positive")
        if not self.request_rate > 0:
            raise ValueError("request_rate must be positive (inf sends all at once)")
        if unknown := set(self.configs) - {"radix", "off"}:
            raise ValueError(f"unknown configs {sorted(unknown)}; use radix and/or off")


def shared_system_prompt_chats(cfg: ServeBenchConfig) -> list[list[dict]]:
    """Each request: one of a few long system prompts, then a user's own short question."""
    systems = [
        "You are a support assistant. Follow these notes:\n"
        + "\n".join(_corpus(seed=100 + k, lines=cfg.system_sentences))
        for k in range(cfg.system_prompts)
    ]
    rng = random.Random(cfg.seed)
    questions = _corpus(seed=cfg.seed + 7, lines=cfg.requests)
    return [
        [
            {"role": "system", "content": rng.choice(systems)},
            {"role": "user", "content": f"User {i}: {questions[i]}"},
        ]
        for i in range(cfg.requests)
    ]


@dataclass
class RequestRecord:
    ok: bool = False
    error: str = ""
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


async def _stream_chat(
    client: httpx.AsyncClient, messages: list[dict], max_tokens: int
) -> RequestRecord:
    rec = RequestRecord()
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # fixed output lengths make configurations comparable
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                rec.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    rec.error = event["error"]["message"]
                    return rec
                if event.get("usage"):
                    u = event["usage"]
                    rec.prompt_tokens, rec.completion_tokens = (
                        u["prompt_tokens"],
                        u["completion_tokens"],
                    )
                    rec.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
                # Each chunk is one scheduler step's tokens; its text may be empty (a special
                # token, a held-back stop prefix), so arrival is timed by chunk, not by text.
                if event.get("choices"):
                    now = time.perf_counter()
                    if rec.ttft_s == 0.0:
                        rec.ttft_s = now - start
                    else:
                        rec.itl_s.append(now - last)
                    last = now
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        return rec
    rec.e2e_s = time.perf_counter() - start
    rec.ok = rec.completion_tokens > 0
    if not rec.ok:
        rec.error = "stream ended without usage"
    return rec


async def drive(
    url: str,
    chats: list[list[dict]],
    cfg: ServeBenchConfig,
    on_done: Callable[[], None] = lambda: None,
) -> tuple[list[RequestRecord], float]:
    """Send every chat at the configured rate and concurrency; returns records and seconds."""
    gate = asyncio.Semaphore(cfg.concurrency)
    rng = np.random.default_rng(cfg.seed)
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=0)

    async with httpx.AsyncClient(base_url=url, timeout=600.0, limits=limits) as client:

        async def one(messages: list[dict]) -> RequestRecord:
            async with gate:
                rec = await _stream_chat(client, messages, cfg.max_tokens)
            on_done()
            return rec

        start = time.perf_counter()
        tasks = []
        for messages in chats:
            tasks.append(asyncio.create_task(one(messages)))
            if cfg.request_rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / cfg.request_rate))
        records = await asyncio.gather(*tasks)
        return records, time.perf_counter() - start


def summarize(label: str, records: list[RequestRecord], seconds: float) -> dict:
    done = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in done] or [float("nan")]
    itl = [x for r in done for x in r.itl_s] or [float("nan")]
    prompt = sum(r.prompt_tokens for r in done)
    return {
        "config": label,
        "requests": len(records),
        "errors": len(records) - len(done),
        "seconds": seconds,
        "req_s": len(done) / seconds,
        "out_tok_s": sum(r.completion_tokens for r in done) / seconds,
        "ttft_p50_ms": 1000 * float(np.percentile(ttft, 50)),
        "ttft_p99_ms": 1000 * float(np.percentile(ttft, 99)),
        "itl_p50_ms": 1000 * float(np.percentile(itl, 50)),
        "itl_p99_ms": 1000 * float(np.percentile(itl, 99)),
        "e2e_p50_s": float(np.percentile([r.e2e_s for r in done] or [float("nan")], 50)),
        "hit_rate": sum(r.cached_tokens for r in done) / prompt if prompt else 0.0,
        "first_error": next((r.error for r in records if not r.ok), ""),
    }


def run_config(
    cfg: ServeBenchConfig, label: str, on_done: Callable[[], None] = lambda: None
) -> dict:
    """One server process: warm it, drive the load, audit invariants, stop it with SIGTERM."""
    args = [
        "--model",
        cfg.model,
        "--page-size",
        str(cfg.page_size),
        "--max-running-requests",
        str(cfg.concurrency),
        "--seed",
        str(cfg.seed),
    ]
    if label == "off":
        args.append("--disable-prefix-cache")
    chats = shared_system_prompt_chats(cfg)
    with ServerProcess(args) as server:
        warm = {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2}
        httpx.post(server.url + "/v1/chat/completions", json=warm, timeout=120.0)
        httpx.post(server.url + "/flush_cache", timeout=60.0)  # first-call costs stay out
        records, seconds = asyncio.run(drive(server.url, chats, cfg, on_done))
        audit = httpx.get(server.url + "/check_invariants", timeout=120.0).json()
        t0 = time.perf_counter()
        graceful = server.stop()
        row = summarize(label, records, seconds)
        row["invariants"] = "ok" if audit["ok"] else audit["error"]
        row["shutdown"] = "graceful" if graceful else "FAILED"
        row["shutdown_s"] = time.perf_counter() - t0
        return row


def run_serve_bench(cfg: ServeBenchConfig, on_done: Callable[[], None]) -> list[dict]:
    rows = [run_config(cfg, label, on_done) for label in cfg.configs]
    off = next((r for r in rows if r["config"] == "off"), None)
    for r in rows:
        r["speedup"] = r["req_s"] / off["req_s"] if off and off["req_s"] else float("nan")
    return rows


TABLES = (
    TableSpec(
        "rows",
        "the HTTP server under load",
        (
            Column("config", "cache"),
            Column("errors", "errors"),
            Column("req_s", "req/s", num(2)),
            Column("ttft_p50_ms", "TTFT p50", num(0)),
            Column("ttft_p99_ms", "TTFT p99", num(0)),
            Column("itl_p50_ms", "ITL p50", num(0)),
            Column("itl_p99_ms", "ITL p99", num(0)),
            Column("hit_rate", "hit rate", pct),
            Column("speedup", "speedup", times, wide=True),
            Column("invariants", "invariants", wide=True),
            Column("shutdown", "SIGTERM", wide=True),
        ),
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bench-135m", help="a preset or a HF directory")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument(
        "--request-rate", type=float, default=float("inf"), help="req/s (default: all at once)"
    )
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--configs", nargs="+", default=["radix", "off"], help="radix and/or off")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    cfg = ServeBenchConfig(
        model=args.model,
        requests=args.requests,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        max_tokens=args.max_tokens,
        system_prompts=args.system_prompts,
        page_size=args.page_size,
        configs=tuple(args.configs),
        seed=args.seed,
    )
    with Progress(transient=True) as progress:
        task = progress.add_task("bench serve", total=cfg.requests * len(cfg.configs))
        rows = run_serve_bench(cfg, lambda: progress.advance(task))
    rate = "all at once" if cfg.request_rate == float("inf") else f"{cfg.request_rate:g} req/s"
    print(
        f"{cfg.model} over HTTP: {cfg.requests} streamed chats, {cfg.system_prompts} shared "
        f"system prompts, {cfg.concurrency} concurrent, {rate}, {cfg.max_tokens} tokens each; "
        "latencies in ms"
    )
    print_tables({"rows": rows}, TABLES, args.wide)
    if args.json:
        write_json(args.json, {"config": vars(cfg), "rows": rows})
    failed = [
        r for r in rows if r["errors"] or r["invariants"] != "ok" or r["shutdown"] != "graceful"
    ]
    for r in failed:
        why = r["first_error"] or f"invariants {r['invariants']}, shutdown {r['shutdown']}"
        print(f"{r['config']}: failed: {why}")
    return 1 if failed else 0
