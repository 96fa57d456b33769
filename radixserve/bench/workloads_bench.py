"""``radixserve bench serving``: the suite's workloads through the engine in several
configurations, side by side, plus transformers' batched ``generate`` and (when given) vLLM.

Each workload is sent wave by wave (a wave at once, the next when it is done). One engine
per configuration is built once and its cache flushed between runs; configurations
alternate within each workload, every other round reversed. A configuration's row is its
median round; each comparison with the first configuration is the median of the paired
rounds' time ratios and their min-max.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from radixserve.bench import common
from radixserve.bench.common import Step
from radixserve.bench.transformers_peer import run_transformers, transformers_twin
from radixserve.bench.workloads import SERVING_WORKLOADS, Workload, make_workload
from radixserve.engine import Engine, SamplingParams, compute_thread
from radixserve.tables import Column, TableSpec, finish, num, pct, plot, times

ENGINE_CONFIGS: dict[str, dict] = {
    "radix-lpm": {"cache_index": "radix", "schedule_policy": "lpm"},
    "radix-fcfs": {"cache_index": "radix", "schedule_policy": "fcfs"},
    "block-hash-fcfs": {"cache_index": "block-hash", "schedule_policy": "fcfs"},
    "off": {"enable_prefix_cache": False, "schedule_policy": "fcfs"},
    # radix-lpm on the torch reference attention instead of the native kernels
    "radix-lpm-torch": {"schedule_policy": "lpm", "attention_backend": "torch"},
}
PEERS = ("transformers", "vllm")


@dataclass(frozen=True)
class ServingBenchConfig:
    model: str = "bench-135m"
    workloads: tuple[str, ...] = tuple(SERVING_WORKLOADS)
    configs: tuple[str, ...] = ("radix-lpm", "radix-fcfs", "block-hash-fcfs", "off", "transformers")
    scale: float = 1.0
    max_tokens: int = 8
    page_size: int = 16
    kv_tokens: int = 16384  # KV slots per engine
    rounds: int = 1
    hf_batch: int = 8
    seed: int = 0
    vllm_python: str | None = None  # an interpreter whose environment has vllm
    dtype: str = "float32"
    quantize: str = "auto"  # a GGUF file's own formats; none, int8, int4: as load_model takes
    warm: bool = False  # time a second pass over what the first one cached

    def __post_init__(self) -> None:
        common.check_choices("workload", self.workloads, SERVING_WORKLOADS)
        common.check_choices("config", self.configs, [*ENGINE_CONFIGS, *PEERS])


def run_engine(engine: Engine, workload: Workload, label: str, warm: bool = False) -> dict:
    """Send each wave at once and wait for it (after an untimed pass that fills the cache
    when ``warm``); the row for this configuration, from the engine's own metrics."""
    assert engine.flush_cache()  # also starts the engine's lookup-latency window afresh

    def send() -> list[dict]:
        metas = []
        for wave in workload.waves:
            params = [
                SamplingParams(max_new_tokens=r.max_tokens, temperature=0, ignore_eos=True)
                for r in wave
            ]
            outs = engine.generate(input_ids=[r.prompt for r in wave], sampling_params=params)
            metas += [o["meta_info"] for o in outs]
        return metas

    if warm:
        send()
    metas, seconds, grown = common.timed(engine, send)
    lookup_p50_us = engine.cache_stats()["lookup_p50_us"]
    engine.check_invariants()
    ttft = [m["ttft_s"] for m in metas]
    decode_s = grown["decode_s"]
    return workload.row(label, seconds, sum(m["cached_tokens"] for m in metas)) | {
        "decode_tok_s": grown["decode_tokens"] / decode_s if decode_s else float("nan"),
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "lookup_p50_us": lookup_p50_us,
    }


def run_serving_bench(cfg: ServingBenchConfig, step: Step = lambda label: None) -> dict:
    """Rows per (workload, config), pairs against the first config, the optimal hit rates."""
    options = dict(
        page_size=cfg.page_size,
        max_total_tokens=cfg.kv_tokens,
        dtype=cfg.dtype,
        quantize=cfg.quantize,
    )
    engines = {
        name: Engine(cfg.model, seed=cfg.seed, **options, **ENGINE_CONFIGS[name])
        for name in cfg.configs
        if name in ENGINE_CONFIGS
    }
    vocab = next(iter(engines.values())).vocab_size if engines else 32000
    warm = SamplingParams(max_new_tokens=4, ignore_eos=True)
    for engine in engines.values():  # first-call costs (allocations, kernel setup) stay out
        engine.generate(input_ids=[list(range(3, 515))] * 4, sampling_params=warm)
    hf = peer = None
    if "transformers" in cfg.configs:
        from radixserve.model.loader import load_model

        # on the engines' compute thread: a second thread's OpenMP team slows every engine
        dtype = getattr(torch, cfg.dtype)
        loaded = partial(load_model, cfg.model, dtype, quantize=cfg.quantize)
        hf = compute_thread.call(lambda: transformers_twin(loaded()))
    rows, pairs, optimal = [], [], {}
    try:
        if "vllm" in cfg.configs and cfg.vllm_python is not None:
            from radixserve.bench.vllm_peer import VllmPeer

            peer = VllmPeer(cfg.vllm_python, cfg.model, cfg.page_size, cfg.dtype)
        for index, name in enumerate(cfg.workloads):
            work = make_workload(name, vocab, cfg.scale, cfg.max_tokens, cfg.seed)
            optimal[name] = work.optimal_hit_rate(cfg.page_size)
            # each workload starts from a different configuration, so none is always first
            shift = index % len(cfg.configs)
            rounds: dict[str, list[dict]] = {}
            for label in common.alternating(cfg.configs[shift:] + cfg.configs[:shift], cfg.rounds):
                if label in engines:
                    row = run_engine(engines[label], work, label, cfg.warm)
                elif label == "transformers":
                    row = compute_thread.call(partial(run_transformers, hf, work, cfg.hf_batch))
                else:  # vllm, when its interpreter is given
                    row = None if peer is None else peer.run(work, cfg.warm)
                if row is not None:
                    rounds.setdefault(label, []).append(row)
                step(f"{name}: {label}")
            first = rounds.get(cfg.configs[0])
            for label in (c for c in cfg.configs if c in rounds):
                row = common.median_round(rounds[label])
                row |= {"round_seconds": [r["seconds"] for r in rounds[label]]}
                row |= {"optimal_hit_rate": optimal[name]}
                row |= {"of_optimal": row["hit_rate"] / optimal[name] if optimal[name] else None}
                rows.append(row)
                if first is not None and label != cfg.configs[0]:
                    pairs.append(_pair(name, label, cfg.configs[0], rounds[label], first))
    finally:
        if peer is not None:
            peer.close()
        for engine in engines.values():
            engine.shutdown()
    return {"rows": rows, "pairs": pairs, "optimal": optimal}


def _pair(workload: str, label: str, vs: str, mine: list[dict], first: list[dict]) -> dict:
    """``label``'s time over the first configuration's, round by round."""
    ratio = common.paired("ratio", mine, first, "seconds")
    ratio["time_ratio"] = ratio.pop("ratio")
    prefill = mine[0]["prefill_tokens"] / max(first[0]["prefill_tokens"], 1)
    row = {"workload": workload, "config": label, "vs": vs, "rounds": len(mine)}
    return row | ratio | {"prefill_ratio": prefill}


TABLES = (
    TableSpec(
        "rows",
        "serving workloads (the median round of each configuration)",
        (
            Column("workload", "workload"),
            Column("config", "config"),
            Column("req_s", "req/s", num(2)),
            Column("tok_s", "tok/s", num(0), wide=True),
            Column("ttft_p50_s", "TTFT p50 s", num(2)),
            Column("ttft_p99_s", "TTFT p99 s", num(2), wide=True),
            Column("hit_rate", "hit rate", pct),
            Column("of_optimal", "of optimal", pct),
            Column("prefill_tokens", "prefilled", wide=True),
            Column("lookup_p50_us", "lookup p50 µs", num(1), wide=True),
            Column("decode_tok_s", "decode tok/s", num(1), wide=True),
        ),
    ),
    TableSpec(
        "pairs",
        "time and prefilled tokens over the first configuration's (paired rounds)",
        (
            Column("workload", "workload"),
            Column("config", "config"),
            Column("vs", "vs", wide=True),
            Column("rounds", "rounds", wide=True),
            Column("time_ratio", "time ratio", times),
            Column("ratio_min", "min", times),
            Column("ratio_max", "max", times),
            Column("prefill_ratio", "prefilled", times),
        ),
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    names = "workloads configs scale max_tokens page_size rounds dtype quantize warm"
    names += " vllm_python"
    helps = {
        "quantize": "auto (a GGUF file's own formats), none, int8, int4",
        "configs": f"the first is compared with the others; any of {[*ENGINE_CONFIGS, *PEERS]}",
        "scale": "multiplies request counts",
        "warm": "time a pass over what a first one cached",
        "vllm_python": "python of a venv with vllm, for the vllm config",
    }
    common.add_options(p, ServingBenchConfig, names, plot=True, **helps)


def run(args: argparse.Namespace) -> int:
    cfg = common.configure(ServingBenchConfig, args, {"scale": 0.25})
    total = len(cfg.workloads) * cfg.rounds * len(cfg.configs)
    result = common.with_progress("bench serving", total, lambda step: run_serving_bench(cfg, step))

    def chart(path: str) -> None:
        rows = [r | {"bar": f"{r['workload']}, {r['config']}"} for r in result["rows"]]
        plot(path, rows, "bar", ["req_s", "hit_rate"], "bar", bars=True)

    return finish(args, cfg, result, TABLES, chart)
