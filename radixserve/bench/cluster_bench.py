"""``radixserve bench cluster``: engine replicas on a local Ray Serve cluster under a
multi-tenant chat load (system prompts with Zipf popularity, a user question each, Poisson
arrivals), one router after another: the prefix router, round-robin, power of two choices,
and one engine holding the whole machine (``single``: the hit rate routing aims at).
Ray's own ``PrefixCacheAffinityRouter`` needs ``ray[llm]`` (which needs vLLM or SGLang in
the same environment) and is not run here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time
from dataclasses import dataclass, replace

import httpx

from radixserve.bench import plots
from radixserve.bench.report import (
    Column,
    TableSpec,
    finish,
    num,
    pct,
    times,
    with_progress,
)
from radixserve.bench.serve_load import ChatLoad, drive, summarize
from radixserve.bench.timing import alternating

ROUTERS = ("prefix", "round-robin", "power-of-two")


@dataclass(frozen=True)
class ClusterBenchConfig:
    model: str = "bench-135m"
    replicas: int = 2
    routers: tuple[str, ...] = ROUTERS
    requests: int = 256  # 16 users a system prompt on average
    request_rate: float = 8.0  # Poisson, above what the machine serves: req/s is capacity
    max_tokens: int = 16
    system_prompts: int = 16
    system_sentences: int = 72  # ~1,000 tokens each
    zipf: float = 1.1
    kv_pool: int = 10240  # per replica: over half the system prompts, not all of them
    rounds: int = 2
    seed: int = 0

    def load(self) -> ChatLoad:
        return ChatLoad(
            requests=self.requests,
            concurrency=64,
            request_rate=self.request_rate,
            max_tokens=self.max_tokens,
            system_prompts=self.system_prompts,
            system_sentences=self.system_sentences,
            zipf=self.zipf,
            seed=self.seed,
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deploy(cfg: ClusterBenchConfig, label: str, url: str, cpus: float) -> None:
    from ray import serve

    from radixserve.cluster.app import ClusterSpec, build_app

    replicas = 1 if label == "single" else cfg.replicas
    pool = cfg.kv_pool * cfg.replicas // replicas  # the same memory in all
    spec = ClusterSpec(
        model=cfg.model,
        replicas=replicas,
        router="prefix" if label == "single" else label,
        engine_options={"page_size": 16, "max_total_tokens": pool},
        cpus_per_replica=cpus / replicas,
    )
    serve.run(build_app(spec), name="radixserve", route_prefix="/")
    deadline = time.monotonic() + 120
    while len(httpx.get(url + "/cluster", timeout=30).json()["replicas"]) < replicas:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{replicas} replicas never came up")
        time.sleep(0.5)
    warm = {"prompt": "warm up", "max_tokens": 2}
    for _ in range(2 * replicas):  # the first forward of each replica pays its set-up
        httpx.post(url + "/v1/completions", json=warm, timeout=120)
    httpx.post(url + "/flush_cache", timeout=60)


def run_cluster_bench(cfg: ClusterBenchConfig, step) -> dict:
    import ray
    from ray import serve

    from radixserve.cluster.app import NAMESPACE

    cpus = float(os.cpu_count() or 1)
    ray.init(num_cpus=int(cpus), include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    runs: dict[str, list[dict]] = {label: [] for label in ("single", *cfg.routers)}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for label in alternating(list(runs), cfg.rounds):
            _deploy(cfg, label, url, cpus)
            records, seconds = asyncio.run(drive(url, cfg.load()))
            runs[label].append(summarize(records, seconds))
            serve.delete("radixserve")
            step(label)
    finally:
        serve.delete("radixserve")
        ray.shutdown()  # Serve goes with the local Ray
    return {"rows": _rows(runs)}


def _rows(runs: dict[str, list[dict]]) -> list[dict]:
    from statistics import median

    def med(label: str, key: str) -> float:
        return median(r[key] for r in runs[label])

    rows = []
    for label, rounds in runs.items():
        row = {"config": label, **{k: med(label, k) for k in rounds[0] if k != "first_error"}}
        row["hit_vs_single"] = row["hit_rate"] / max(med("single", "hit_rate"), 1e-9)
        if "round-robin" in runs:
            base = runs["round-robin"]
            pairs = [a["req_s"] / b["req_s"] for a, b in zip(rounds, base, strict=True)]
            row["req_s_vs_rr"] = median(pairs)
            row["req_s_vs_rr_min"], row["req_s_vs_rr_max"] = min(pairs), max(pairs)
        row["first_error"] = next((r["first_error"] for r in rounds if r["first_error"]), "")
        rows.append(row)
    return rows


TABLES = (
    TableSpec(
        "rows",
        "replicas behind each router, against one engine with the whole machine",
        (
            Column("config", "router"),
            Column("req_s", "req/s", num(2)),
            Column("req_s_vs_rr", "vs RR", times),
            Column("ttft_p50_ms", "TTFT p50", num(0)),
            Column("ttft_p99_ms", "TTFT p99", num(0)),
            Column("hit_rate", "hit", pct),
            Column("hit_vs_single", "of single", pct),
            Column("errors", "errors", wide=True),
            Column("itl_p99_ms", "ITL p99", num(0), wide=True),
        ),
    ),
)
QUICK = {
    "model": "tiny",
    "requests": 24,
    "request_rate": float("inf"),
    "rounds": 1,
    "system_prompts": 4,
    "system_sentences": 4,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bench-135m", help="any model argument (docs/models.md)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=ROUTERS)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--request-rate", type=float, default=8.0, help="Poisson; inf: all at once")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--plot", help="write a PNG chart here")
    p.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")


def run(args: argparse.Namespace) -> int:
    cfg = ClusterBenchConfig(
        model=args.model,
        replicas=args.replicas,
        routers=tuple(args.routers),
        requests=args.requests,
        request_rate=args.request_rate,
        rounds=args.rounds,
    )
    if args.quick:
        cfg = replace(cfg, **QUICK)
    total = cfg.rounds * (1 + len(cfg.routers))
    result = with_progress("bench cluster", total, lambda step: run_cluster_bench(cfg, step))
    return finish(
        args, cfg, result, TABLES, lambda path: plots.plot_cluster_bench(result["rows"], path)
    )
