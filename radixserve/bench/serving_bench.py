"""``radixserve bench serving``: the suite's workloads through the engine in several
configurations, side by side, plus transformers' batched ``generate`` and (when given) vLLM.

Configurations alternate within each workload, every other round reversed (A B C D,
D C B A, ...), so machine drift hits all alike and no configuration always runs right after
the same neighbour (a cyclic A B C D, A B C D put one configuration after transformers'
memory-hungry `generate` in every round). Each keeps its fastest round, and every round's
time is kept too, so two configurations can be compared round by round (neighbours in
time) rather than best against best. One engine per configuration is built once and its
cache flushed between runs. Each run also hashes what its forward passes computed and
times them apart from the engine's own work: two configurations that ran the same batches
are compared at a shared forward time too, which the machine's noise cannot tilt (on this
machine two identical engines, radix-lpm and radix-lpm-twin, differ by up to 8-29% round to
round). The KV-pool sweep
serves chosen workloads with pools smaller than their distinct tokens, where eviction and
the order of admission decide what stays cached.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist, fmean, median, stdev

import numpy as np
import torch

from radixserve.attention.attention_plan import AttentionPlan
from radixserve.bench.workloads import SERVING_WORKLOADS, Workload, make_workload
from radixserve.engine import Engine, SamplingParams

ENGINE_CONFIGS: dict[str, dict] = {
    "radix-lpm": {"cache_index": "radix", "schedule_policy": "lpm"},
    "radix-fcfs": {"cache_index": "radix", "schedule_policy": "fcfs"},
    "block-hash-fcfs": {"cache_index": "block-hash", "schedule_policy": "fcfs"},
    "off": {"enable_prefix_cache": False, "schedule_policy": "fcfs"},
    # radix-lpm's twin, a second engine: an A/A pair shows the machine's noise alone
    "radix-lpm-twin": {"cache_index": "radix", "schedule_policy": "lpm"},
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


@dataclass
class _Forwards:
    """What the model's forward passes computed, hashed: each batch's context and new-token
    lengths and the attention plan the backend made of it (bench only). Two configurations
    with the same hash did the same model work, pass by pass, so their times differ only by
    the engine's own work around the model (scheduling, the prefix index, sampling) and by
    the machine's noise."""

    digest: hashlib._Hash = field(default_factory=hashlib.sha256)

    def attach(self, engine: Engine) -> Callable[[], None]:
        """Wrap ``engine``'s attention planning; returns the undo."""
        backend = engine.runner.backend
        prepare = backend.prepare

        def hashed_prepare(batch):
            prepare(batch)
            self.digest.update(repr((batch.seq_lens, batch.extend_lens)).encode())
            plan = batch.attn_metadata
            if isinstance(plan, AttentionPlan):
                self.digest.update(plan.items.numpy().tobytes())

        backend.prepare = hashed_prepare

        def detach() -> None:
            backend.prepare = prepare

        return detach


def _poll_dedup(engine: Engine, stop: threading.Event, out: list[float]) -> None:
    while not stop.wait(0.05):
        s = engine.cache_stats()
        if s["running"]:
            out.append(s["memory_dedup_ratio"])


def run_engine(engine: Engine, workload: Workload, label: str) -> dict:
    """Send each wave at once and wait for it; returns the row for this configuration."""
    assert engine.flush_cache()  # also starts the engine's lookup-latency window afresh
    forwards = _Forwards()
    detach = forwards.attach(engine)
    before = engine.cache_stats()
    dedup: list[float] = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll_dedup, args=(engine, stop, dedup), daemon=True)
    poller.start()
    metas = []
    start = time.perf_counter()
    try:
        for wave in workload.waves:
            params = [
                SamplingParams(max_new_tokens=r.max_tokens, temperature=0, ignore_eos=True)
                for r in wave
            ]
            outs = engine.generate(input_ids=[r.prompt for r in wave], sampling_params=params)
            metas += [o["meta_info"] for o in outs]
    finally:
        seconds = time.perf_counter() - start
        stop.set()
        poller.join()
        detach()
    after = engine.cache_stats()
    engine.check_invariants()
    prompt = sum(m["prompt_tokens"] for m in metas)
    cached = sum(m["cached_tokens"] for m in metas)
    out_tokens = sum(m["completion_tokens"] for m in metas)
    ttft = [m["ttft_s"] for m in metas]
    predicted = [
        1 - ((m["prompt_tokens"] - m["cached_tokens"]) / m["prompt_tokens"]) ** 2 for m in metas
    ]
    steps = after["scheduler_steps"] - before["scheduler_steps"]
    decode_s = after["decode_s"] - before["decode_s"]
    decode_tokens = after["decode_tokens"] - before["decode_tokens"]
    sched = after["scheduler_s"] - before["scheduler_s"]
    forward_s = after["forward_s"] - before["forward_s"]
    return {
        "workload": workload.name,
        "config": label,
        "requests": len(metas),
        "seconds": seconds,
        "engine_seconds": seconds - forward_s,  # all but the model's forward passes
        "batches": forwards.digest.hexdigest()[:16],
        "req_s": len(metas) / seconds,
        "tok_s": (prompt + out_tokens) / seconds,
        "decode_tok_s": decode_tokens / decode_s if decode_s else float("nan"),
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "ttft_mean_s": float(np.mean(ttft)),
        "e2e_p50_s": float(np.percentile([m["latency_s"] for m in metas], 50)),
        "hit_rate": cached / prompt,
        "prefill_tokens": prompt - cached,
        "dedup_ratio": float(np.mean(dedup)) if dedup else 1.0,
        "sched_ms_per_step": 1000 * sched / steps if steps else float("nan"),
        "lookup_p50_us": after["lookup_p50_us"],
        "lookup_p99_us": after["lookup_p99_us"],
        "seed_model_ttft_reduction": float(np.mean(predicted)),
    }


@torch.inference_mode()
def run_transformers(hf, workload: Workload, batch: int) -> dict:
    """transformers' ``generate``, greedy, batches of similar length, left-padded; no reuse
    across requests (each batch computes every prompt token)."""
    start = time.perf_counter()
    done = 0
    for wave in workload.waves:
        ordered = sorted(wave, key=lambda r: len(r.prompt))
        for i in range(0, len(ordered), batch):
            group = ordered[i : i + batch]
            width = max(len(r.prompt) for r in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, r in enumerate(group):
                ids[row, width - len(r.prompt) :] = torch.from_numpy(r.prompt.astype(np.int64))
                mask[row, width - len(r.prompt) :] = 1
            new = max(r.max_tokens for r in group)
            hf.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
            done += len(group)
    seconds = time.perf_counter() - start
    prompt = workload.prompt_tokens
    outputs = sum(r.max_tokens for r in workload.requests)
    return {
        "workload": workload.name,
        "config": "transformers",
        "requests": done,
        "seconds": seconds,
        "req_s": done / seconds,
        "tok_s": (prompt + outputs) / seconds,
        "hit_rate": 0.0,
        "prefill_tokens": prompt,
    }


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

        hf = transformers_twin(load_preset(cfg.model))
    rows: list[dict] = []
    optimal: dict[str, float] = {}
    try:
        for index, name in enumerate(cfg.workloads):
            work = make_workload(name, vocab, cfg.scale, cfg.max_tokens, cfg.seed)
            optimal[name] = work.optimal_hit_rate(cfg.page_size)
            best: dict[str, dict] = {}
            rounds: dict[str, list[dict]] = {}
            # Each workload starts from a different configuration, so none is always first.
            shift = index % len(cfg.configs)
            order = cfg.configs[shift:] + cfg.configs[:shift]
            for round_index in range(cfg.rounds):
                for label in order if round_index % 2 == 0 else order[::-1]:
                    row = _run_one(label, engines, hf, work, cfg)
                    if row is not None:
                        rounds.setdefault(label, []).append(row)
                    if row is not None and (
                        label not in best or row["seconds"] < best[label]["seconds"]
                    ):
                        best[label] = row
                    step(f"{name}: {label}")
            off = best.get("off")
            for label, row in best.items():
                row["round_seconds"] = [r["seconds"] for r in rounds[label]]
                if "engine_seconds" in row:  # the engine's rows, not the baselines'
                    row["round_engine_seconds"] = [r["engine_seconds"] for r in rounds[label]]
                    # one hash when every round ran the same batches (scheduling is seeded)
                    hashes = {r["batches"] for r in rounds[label]}
                    row["batches"] = hashes.pop() if len(hashes) == 1 else "varies"
                row["optimal_hit_rate"] = optimal[name]
                row["of_optimal"] = row["hit_rate"] / optimal[name] if optimal[name] else None
                if off is not None:
                    row["speedup_vs_off"] = off["seconds"] / row["seconds"]
                    if "ttft_mean_s" in row:
                        row["ttft_reduction"] = 1 - row["ttft_mean_s"] / off["ttft_mean_s"]
            rows += [best[c] for c in cfg.configs if c in best]
        sweep = [row for name in cfg.sweep_workloads for row in _kv_sweep(cfg, name, vocab, step)]
    finally:
        for engine in engines.values():
            engine.shutdown()
    return {"rows": rows, "sweep": sweep, "optimal": optimal}


def _run_one(label, engines, hf, work: Workload, cfg: ServingBenchConfig) -> dict | None:
    if label in engines:
        return run_engine(engines[label], work, label)
    if label == "transformers":
        return run_transformers(hf, work, cfg.hf_batch)
    if cfg.vllm_python is None:
        return None
    from radixserve.bench.vllm_peer import run_vllm

    return run_vllm(cfg.vllm_python, cfg.model, work, cfg.page_size)


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


def paired_ratios(slow: dict, fast: dict, key: str = "round_seconds") -> list[float]:
    """``slow``'s time over ``fast``'s, round by round (each pair ran back to back)."""
    a, b = slow.get(key, []), fast.get(key, [])
    return [x / y for x, y in zip(a, b, strict=True)] if len(a) == len(b) else []


def _t_quantile(p: float, df: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion around the normal one
    (Abramowitz & Stegun 26.7.5): within 1% from 2 degrees of freedom, 11% at 1."""
    z = NormalDist().inv_cdf(p)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * df**4)
    )


def ratio_interval(ratios: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """A confidence interval for the typical ratio of paired rounds (t on their logs, since
    a ratio's noise multiplies): what the rounds can tell apart from 1.0 on this machine."""
    logs = [float(np.log(r)) for r in ratios]
    half = _t_quantile(0.5 + level / 2, len(logs) - 1) * stdev(logs) / len(logs) ** 0.5
    return float(np.exp(fmean(logs) - half)), float(np.exp(fmean(logs) + half))


def _spread(ratios: Sequence[float], digits: int) -> tuple[str, float, float]:
    """The rounds' range and 95% interval, as the targets table shows them, and the interval
    (a single round: the ratio itself)."""
    if len(ratios) == 1:
        return f"{ratios[0]:.{digits}f} (1 round)", ratios[0], ratios[0]
    low, high = ratio_interval(ratios)
    text = (
        f"{min(ratios):.{digits}f} to {max(ratios):.{digits}f} ({len(ratios)} rounds; "
        f"95% interval {low:.{digits}f} to {high:.{digits}f})"
    )
    return text, low, high


def check_targets(rows: Sequence[dict], sweep: Sequence[dict] = ()) -> list[dict]:
    """The issue's targets against this run: one row per target and workload measured.
    A throughput ratio is the median of the round-by-round ratios when there are several
    rounds (with their range and a 95% interval): neighbouring runs share the machine's
    mood, where best-of-rounds compares two different moments. Where both sides did the
    same work, a ratio below its goal whose interval still holds the goal reads "tie": the
    rounds cannot order the two."""
    by = {(r["workload"], r["config"]): r for r in rows}
    out = []

    def add(target: str, workload: str, value: float, goal: float, spread: str = "") -> None:
        out.append(
            {
                "target": target,
                "workload": workload,
                "measured": value,
                "goal": goal,
                "met": "yes" if value >= goal else "no",
                "rounds": spread,
            }
        )

    def add_speedup(
        target: str, workload: str, slow: dict, fast: dict, goal: float, same_work: bool = False
    ) -> None:
        ratios = paired_ratios(slow, fast)
        if len(ratios) > 1:
            spread, low, high = _spread(ratios, 2)
            add(target, workload, median(ratios), goal, spread)
            if same_work and out[-1]["met"] == "no" and low <= goal <= high:
                out[-1]["met"] = "tie (same work)"  # the same tokens computed
        else:
            add(target, workload, slow["seconds"] / fast["seconds"], goal)

    def add_same_batches(target: str, workload: str, slow: dict, fast: dict) -> None:
        # The same model work pass by pass (hashed): what the index can change is the
        # engine's own time around the forward passes; the forward passes' times differ by
        # the machine alone, so each pair of rounds is judged at their mean forward time.
        batches = fast.get("batches", "varies")
        if batches == "varies" or slow.get("batches") != batches:
            return
        ratios = []
        for ts, es, tf, ef in zip(
            slow["round_seconds"],
            slow["round_engine_seconds"],
            fast["round_seconds"],
            fast["round_engine_seconds"],
            strict=True,
        ):
            forward = (ts - es + tf - ef) / 2
            ratios.append((forward + es) / (forward + ef))
        throughput, goal = out[-1], out[-1]["goal"]
        spread, low, high = _spread(ratios, 3)
        add(f"{target}, same batches", workload, median(ratios), goal, spread)
        if out[-1]["met"] == "no" and low <= goal <= high:
            out[-1]["met"] = "tie (same batches)"  # the engine's own time within its noise
        if out[-1]["met"] == "yes" and throughput["met"] != "yes":
            throughput["met"] = "yes (same batches, less engine time)"

    def add_work(workload: str, block: dict, radix: dict) -> None:
        # The work each does, which the machine's noise cannot blur.
        work = block["prefill_tokens"] / max(radix["prefill_tokens"], 1)
        add("prefilled tokens, block-hash-fcfs / radix-lpm", workload, work, 1.0)

    for (workload, config), r in by.items():
        if config != "radix-lpm":
            continue
        if workload != "no-sharing" and r.get("of_optimal") is not None:
            add("hit rate / optimal", workload, r["of_optimal"], 0.98)
        off, hf = by.get((workload, "off")), by.get((workload, "transformers"))
        block = by.get((workload, "block-hash-fcfs"))
        if workload in ("shared-system-prompt", "few-shot"):
            if off:
                add_speedup("throughput / cache off", workload, off, r, 3.0)
            if hf:
                add_speedup("throughput / transformers", workload, hf, r, 5.0)
        if block:
            add_work(workload, block, r)
            same = block["prefill_tokens"] == r["prefill_tokens"]
            add_speedup("throughput / block-hash-fcfs", workload, block, r, 1.0, same)
            add_same_batches("throughput / block-hash-fcfs", workload, block, r)
        torch_attention = by.get((workload, "radix-lpm-torch"))
        if workload == "shared-system-prompt" and torch_attention:
            ratio = r["decode_tok_s"] / torch_attention["decode_tok_s"]
            add("decode tok/s / torch attention", workload, ratio, 2.0)
        if workload == "no-sharing" and off:
            add_speedup("throughput / cache off (control)", workload, off, r, 0.98)
            add_same_batches("throughput / cache off (control)", workload, off, r)
    points = {(r["workload"], r["kv_tokens"], r["config"]): r for r in sweep}
    for (workload, kv_tokens, config), r in points.items():
        block = points.get((workload, kv_tokens, "block-hash-fcfs"))
        if config != "radix-lpm" or block is None or r["kv_fraction"] >= 1:
            continue
        where = f"{workload}, {kv_tokens:,} KV slots"
        add(
            "hit rate - block-hash-fcfs (points)",
            where,
            100 * (r["hit_rate"] - block["hit_rate"]),
            0,
        )
        add_work(where, block, r)
        add("throughput / block-hash-fcfs", where, block["seconds"] / r["seconds"], 1.0)
    return out
