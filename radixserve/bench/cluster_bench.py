"""``radixserve bench cluster``: engine replicas on a local Ray Serve cluster under a
multi-tenant chat load (``bench serve``'s, with Zipf-popular system prompts), one router
after another (the prefix router, round-robin, power of two choices) and one engine holding
the whole machine (``single``: the hit rate routing aims at), alternating round by round.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import httpx

from radixserve.bench import common, http_load
from radixserve.bench.common import Step
from radixserve.bench.http_load import ChatLoad, drive, free_port, median_row
from radixserve.tables import Column, TableSpec, finish, num, pct, plot, times

ROUTERS = ("prefix", "round-robin", "power-of-two")


@dataclass(frozen=True)
class ClusterBenchConfig:
    model: str = "bench-135m"
    replicas: int = 2
    routers: tuple[str, ...] = ROUTERS
    requests: int = 256  # 16 users a system prompt on average
    request_rate: float = 8.0  # Poisson, above what the machine serves: req/s is capacity
    system_prompts: int = 16
    system_sentences: int = 72  # ~1,000 tokens each
    kv_pool: int = 10240  # per replica: over half the system prompts, not all of them
    rounds: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        common.check_choices("router", self.routers, ROUTERS)


def run_one(cfg: ClusterBenchConfig, label: str, url: str) -> dict:
    """Deploy ``label``'s application, warm it, load it, take it down."""
    from ray import serve

    from radixserve.cluster.app import ClusterSpec, build_app

    replicas = 1 if label == "single" else cfg.replicas
    spec = ClusterSpec(
        model=cfg.model,
        replicas=replicas,
        router="prefix" if label == "single" else label,
        # the same memory in all
        engine_options={
            "page_size": 16,
            "max_total_tokens": cfg.kv_pool * cfg.replicas // replicas,
        },
        cpus_per_replica=(os.cpu_count() or 1) / replicas,
    )
    serve.run(build_app(spec), name="radixserve", route_prefix="/")
    deadline = time.monotonic() + 120
    while len(httpx.get(url + "/cluster", timeout=30).json()["replicas"]) < replicas:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{replicas} replicas never came up")
        time.sleep(0.5)
    http_load.warm_and_flush(url, times=2 * replicas)  # each replica's first forward pays set-up
    load = ChatLoad(
        requests=cfg.requests,
        request_rate=cfg.request_rate,
        max_tokens=16,
        system_prompts=cfg.system_prompts,
        system_sentences=cfg.system_sentences,
        zipf=1.1,
        seed=cfg.seed,
    )
    row = drive(url, load)
    serve.delete("radixserve")
    return row


def run_cluster_bench(cfg: ClusterBenchConfig, step: Step) -> dict:
    import ray
    from ray import serve

    from radixserve.cluster.app import NAMESPACE

    ray.init(
        num_cpus=os.cpu_count(), include_dashboard=False, namespace=NAMESPACE, log_to_driver=False
    )
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        url = f"http://127.0.0.1:{port}"
        runs = common.run_rounds(
            ("single", *cfg.routers), cfg.rounds, lambda label: run_one(cfg, label, url), step
        )
    finally:
        serve.delete("radixserve")
        ray.shutdown()  # Serve goes with the local Ray
    single = median_row("single", runs["single"])["hit_rate"]
    rows = []
    for label, rounds in runs.items():
        row = median_row(label, rounds)
        row["hit_vs_single"] = row["hit_rate"] / max(single, 1e-9)
        if "round-robin" in runs:
            row |= common.paired("req_s_vs_rr", rounds, runs["round-robin"], "req_s")
        rows.append(row)
    return {"rows": rows}


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
    names = "replicas routers requests request_rate rounds"
    helps = {"request_rate": "Poisson; inf: all at once"}
    common.add_options(p, ClusterBenchConfig, names, plot=True, **helps)


def run(args: argparse.Namespace) -> int:
    cfg = common.configure(ClusterBenchConfig, args, QUICK)
    total = cfg.rounds * (1 + len(cfg.routers))
    result = common.with_progress("bench cluster", total, lambda step: run_cluster_bench(cfg, step))

    def chart(path: str) -> None:
        ys = ["hit_rate", "req_s", "ttft_p99_ms"]
        plot(path, result["rows"], "config", ys, "config", bars=True)

    return finish(args, cfg, result, TABLES, chart)
