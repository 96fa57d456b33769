"""``radixserve bench serving``: the suite's workloads through the engine in several
configurations, side by side, plus transformers' batched ``generate`` and (when given) vLLM.

Configurations alternate within each workload, every other round reversed. One engine per
configuration is built once and its cache flushed between runs. A configuration's row is
its median round; each comparison with the first configuration is the median of the paired
rounds' time ratios and their min-max. The KV-pool sweep serves chosen workloads with pools
smaller than their distinct tokens, where eviction and the order of admission decide what
stays cached.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixserve.bench import plots
from radixserve.bench.engine_run import run_engine
from radixserve.bench.report import (
    Column,
    TableSpec,
    finish,
    ms,
    num,
    pct,
    times,
    with_progress,
)
from radixserve.bench.timing import alternating, median_round, paired
from radixserve.bench.workloads import SERVING_WORKLOADS, Workload, make_workload
from radixserve.engine import Engine, SamplingParams, compute_thread

ENGINE_CONFIGS: dict[str, dict] = {
    "radix-lpm": {"cache_index": "radix", "schedule_policy": "lpm"},
    "radix-fcfs": {"cache_index": "radix", "schedule_policy": "fcfs"},
    "block-hash-fcfs": {"cache_index": "block-hash", "schedule_policy": "fcfs"},
    "off": {"enable_prefix_cache": False, "schedule_policy": "fcfs"},
    # the same as radix-lpm with the torch reference attention instead of the native kernels
    "radix-lpm-torch": {
        "cache_index": "radix",
        "schedule_policy": "lpm",
        "attention_backend": "torch",
    },
}
BASELINES = ("transformers", "vllm")


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
    sweep_workloads: tuple[str, ...] = ()  # KV-pool sweep on these workloads
    sweep_fractions: tuple[float, ...] = (1.0, 0.5, 0.375, 0.25)
    vllm_python: str | None = None  # an interpreter whose environment has vllm
    dtype: str = "float32"
    # time a second pass of each workload over what the first one cached (no flush between)
    warm: bool = False

    def __post_init__(self) -> None:
        for name in (*self.workloads, *self.sweep_workloads):
            if name not in SERVING_WORKLOADS:
                raise ValueError(
                    f"unknown workload {name!r}; choose from {sorted(SERVING_WORKLOADS)}"
                )
        for name in self.configs:
            if name not in ENGINE_CONFIGS and name not in BASELINES:
                raise ValueError(
                    f"unknown config {name!r}; choose from {[*ENGINE_CONFIGS, *BASELINES]}"
                )


def run_serving_bench(
    cfg: ServingBenchConfig, step: Callable[[str], None] = lambda label: None
) -> dict:
    """Rows per (workload, config), the KV-pool sweep if asked, and the optimal hit rates."""
    engines = {
        name: Engine(
            cfg.model,
            page_size=cfg.page_size,
            max_total_tokens=cfg.kv_tokens,
            seed=cfg.seed,
            dtype=cfg.dtype,
            **ENGINE_CONFIGS[name],
        )
        for name in cfg.configs
        if name in ENGINE_CONFIGS
    }
    vocab = next(iter(engines.values())).vocab_size if engines else 32000
    warm = SamplingParams(max_new_tokens=4, ignore_eos=True)
    for engine in engines.values():  # first-call costs (allocations, kernel setup) stay out
        engine.generate(input_ids=[list(range(3, 515))] * 4, sampling_params=warm)
    hf = None
    if "transformers" in cfg.configs:
        from radixserve.bench.model_bench import transformers_twin
        from radixserve.model.presets import load_preset

        # on the engines' compute thread: a second thread's OpenMP team slows every engine
        dtype = getattr(torch, cfg.dtype)
        hf = compute_thread.call(lambda: transformers_twin(load_preset(cfg.model, dtype=dtype)))
    rows: list[dict] = []
    pairs: list[dict] = []
    optimal: dict[str, float] = {}
    peer = None
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
            for label in alternating(cfg.configs[shift:] + cfg.configs[:shift], cfg.rounds):
                row = _run_one(label, engines, hf, peer, work, cfg)
                if row is not None:
                    rounds.setdefault(label, []).append(row)
                step(f"{name}: {label}")
            rows += [_median_round(rounds[c], optimal[name]) for c in cfg.configs if c in rounds]
            pairs += _pairs(name, rounds, cfg.configs)
        sweep = [row for name in cfg.sweep_workloads for row in _kv_sweep(cfg, name, vocab, step)]
    finally:
        if peer is not None:
            peer.close()
        for engine in engines.values():
            engine.shutdown()
    return {"rows": rows, "pairs": pairs, "sweep": sweep, "optimal": optimal}


def _median_round(rounds: list[dict], optimal: float) -> dict:
    row = median_round(rounds)
    return {
        **row,
        "round_seconds": [r["seconds"] for r in rounds],
        "optimal_hit_rate": optimal,
        "of_optimal": row["hit_rate"] / optimal if optimal else None,
    }


def _pairs(workload: str, rounds: dict[str, list[dict]], configs: tuple[str, ...]) -> list[dict]:
    """Each configuration against the first: its time over the first's, round by round."""
    first = configs[0]
    if first not in rounds:
        return []
    out = []
    for label in configs[1:]:
        if label not in rounds:
            continue
        a, b = rounds[label], rounds[first]
        ratio = paired([r["seconds"] for r in a], [r["seconds"] for r in b])
        out.append(
            {
                "workload": workload,
                "config": label,
                "vs": first,
                "rounds": len(a),
                "time_ratio": ratio["median"],
                "ratio_min": ratio["min"],
                "ratio_max": ratio["max"],
                "prefill_ratio": a[0]["prefill_tokens"] / max(b[0]["prefill_tokens"], 1),
            }
        )
    return out


def _run_one(label, engines, hf, peer, work: Workload, cfg: ServingBenchConfig) -> dict | None:
    if label in engines:
        return run_engine(engines[label], work, label, cfg.warm)
    if label == "transformers":
        from radixserve.bench.transformers_peer import run_transformers

        return compute_thread.call(lambda: run_transformers(hf, work, cfg.hf_batch))
    return None if peer is None else peer.run(work, cfg.warm)


def _kv_sweep(
    cfg: ServingBenchConfig, name: str, vocab: int, step: Callable[[str], None]
) -> list[dict]:
    """Hit rate and time as the KV pool shrinks below the workload's distinct tokens."""
    work = make_workload(name, vocab, cfg.scale, cfg.max_tokens, cfg.seed)
    distinct = round((1 - work.optimal_hit_rate(cfg.page_size)) * work.prompt_tokens)
    distinct += sum(r.max_tokens for r in work.requests)
    longest = max(len(r.prompt) + r.max_tokens for r in work.requests)
    out = []
    for fraction in cfg.sweep_fractions:
        pool = max(int(distinct * fraction), 2 * longest)
        pool -= pool % cfg.page_size
        for label in ("radix-lpm", "block-hash-fcfs"):
            with Engine(
                cfg.model,
                page_size=cfg.page_size,
                max_total_tokens=pool,
                seed=cfg.seed,
                **ENGINE_CONFIGS[label],
            ) as engine:
                row = run_engine(engine, work, label)
            optimal = work.optimal_hit_rate(cfg.page_size)
            out.append(
                {**row, "kv_tokens": pool, "kv_fraction": fraction, "optimal_hit_rate": optimal}
            )
            step(f"sweep {name} {fraction:g}: {label}")
    return out


def num_steps(cfg: ServingBenchConfig) -> int:
    sweep = 2 * len(cfg.sweep_fractions) * len(cfg.sweep_workloads)
    return len(cfg.workloads) * cfg.rounds * len(cfg.configs) + sweep


COLUMNS = (
    Column("workload", "workload"),
    Column("config", "config"),
    Column("req_s", "req/s", num(2)),
    Column("tok_s", "tok/s", num(0), wide=True),
    Column("ttft_p50_s", "TTFT p50 s", num(2)),
    Column("ttft_p99_s", "TTFT p99 s", num(2), wide=True),
    Column("e2e_p50_s", "e2e p50 s", num(2), wide=True),
    Column("hit_rate", "hit rate", pct),
    Column("of_optimal", "of optimal", pct),
    Column("prefill_tokens", "prefilled", wide=True),
    Column("dedup_ratio", "dedup", num(2), wide=True),
    Column("sched_ms_per_step", "sched ms/step", num(2), wide=True),
    Column("engine_seconds", "engine ms", ms, wide=True),
    Column("lookup_p50_us", "lookup p50 µs", num(1), wide=True),
    Column("lookup_p99_us", "lookup p99 µs", num(1), wide=True),
    Column("decode_tok_s", "decode tok/s", num(1), wide=True),
)
TABLES = (
    TableSpec("rows", "serving workloads (the median round of each configuration)", COLUMNS),
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
    TableSpec(
        "sweep",
        "KV-pool sweep",
        (
            Column("workload", "workload"),
            Column("kv_tokens", "KV pool tokens"),
            Column("config", "config"),
            Column("hit_rate", "hit rate", pct),
            Column("req_s", "req/s", num(2)),
        ),
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", nargs="+", default=["all"], help="names, or all")
    p.add_argument("--model", default="bench-135m", help="any model argument (docs/models.md)")
    p.add_argument(
        "--configs",
        nargs="+",
        default=list(ServingBenchConfig.configs),
        help=f"the first is compared with the others; any of {[*ENGINE_CONFIGS, *BASELINES]}",
    )
    p.add_argument("--scale", type=float, default=1.0, help="multiplies request counts")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--sweep", nargs="+", help="also sweep the KV-pool size on these workloads")
    p.add_argument("--vllm-python", help="python of a venv with vllm, for the vllm config")
    p.add_argument("--plot", help="write a PNG chart to this file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--warm", action="store_true", help="time a second pass over what the first cached"
    )


def run(args: argparse.Namespace) -> int:
    workloads = tuple(SERVING_WORKLOADS) if args.workload == ["all"] else tuple(args.workload)
    cfg = ServingBenchConfig(
        model=args.model,
        workloads=workloads,
        configs=tuple(args.configs),
        scale=args.scale,
        max_tokens=args.max_tokens,
        page_size=args.page_size,
        rounds=args.rounds,
        seed=args.seed,
        sweep_workloads=tuple(args.sweep or ()),
        vllm_python=args.vllm_python,
        dtype=args.dtype,
        warm=args.warm,
    )
    result = with_progress("bench serving", num_steps(cfg), lambda s: run_serving_bench(cfg, s))
    return finish(
        args,
        cfg,
        result,
        TABLES,
        lambda path: plots.plot_serving_bench(result["rows"], result["sweep"], path),
    )
