"""One engine serving one workload, wave by wave, as ``bench serving`` times it: the row of
what it did (time, TTFT, hit rate, prefilled tokens, memory dedup, scheduling and lookup
costs), read from the engine's own metrics."""

from __future__ import annotations

import threading
import time

import numpy as np

from radixserve.bench.workloads import Workload
from radixserve.engine import Engine, SamplingParams


def _poll_dedup(engine: Engine, stop: threading.Event, out: list[float]) -> None:
    while not stop.wait(0.05):
        s = engine.cache_stats()
        if s["running"]:
            out.append(s["memory_dedup_ratio"])


def _send(engine: Engine, workload: Workload) -> list[dict]:
    metas = []
    for wave in workload.waves:
        params = [
            SamplingParams(max_new_tokens=r.max_tokens, temperature=0, ignore_eos=True)
            for r in wave
        ]
        outs = engine.generate(input_ids=[r.prompt for r in wave], sampling_params=params)
        metas += [o["meta_info"] for o in outs]
    return metas


def run_engine(engine: Engine, workload: Workload, label: str, warm: bool = False) -> dict:
    """Send each wave at once and wait for it (after an untimed pass that fills the cache
    when ``warm``); returns the row for this configuration."""
    assert engine.flush_cache()  # also starts the engine's lookup-latency window afresh
    if warm:
        _send(engine, workload)
    before = engine.cache_stats()
    dedup: list[float] = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll_dedup, args=(engine, stop, dedup), daemon=True)
    poller.start()
    start = time.perf_counter()
    try:
        metas = _send(engine, workload)
    finally:
        seconds = time.perf_counter() - start
        stop.set()
        poller.join()
    after = engine.cache_stats()
    engine.check_invariants()
    prompt = sum(m["prompt_tokens"] for m in metas)
    cached = sum(m["cached_tokens"] for m in metas)
    out_tokens = sum(m["completion_tokens"] for m in metas)
    ttft = [m["ttft_s"] for m in metas]
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
    }
