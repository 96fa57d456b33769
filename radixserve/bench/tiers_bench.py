"""``radixserve bench tiers``: what the disk tier buys on one machine.

- **ttft**: the time to first token of a long prompt served four ways, round by round on a
  fresh prompt each: recomputed (its first time, written through to disk), from the KV pool
  (again), from disk with its files dropped from the OS page cache (``posix_fadvise``, the
  closest to a cold disk without root) and from disk again, now in the page cache. Each is
  set against recomputing, paired by round.
- **restart**: requests sharing a system prompt served twice by one engine (the second pass
  is a warm engine's hits), then once by a new engine on the same folder: the share of the
  warm engine's hits the new one gets from its first requests.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import numpy as np

from radixserve.bench import common
from radixserve.bench.common import Step
from radixserve.engine import Engine, SamplingParams
from radixserve.tables import Column, TableSpec, finish, num, pct, times

FIRST = SamplingParams(max_new_tokens=1, temperature=0)


@dataclass(frozen=True)
class TiersBenchConfig:
    model: str = "bench-135m"
    prefix_tokens: int = 4096
    rounds: int = 3
    restart_requests: int = 8
    system_tokens: int = 1024
    user_tokens: int = 64
    page_size: int = 16
    seed: int = 0


def ttft_rows(cfg: TiersBenchConfig, folder: Path, step: Step) -> list[dict]:
    rng = np.random.default_rng(cfg.seed)
    options = dict(
        page_size=cfg.page_size, disk_cache_dir=str(folder), write_policy="write_through"
    )
    seconds: dict[str, list[float]] = {}
    with Engine(cfg.model, max_total_tokens=4 * cfg.prefix_tokens, **options) as engine:
        engine.generate("warm up", FIRST)
        # The pool comes from calloc: its pages fault in on first write. Touch them all, or
        # whichever source first lands in untouched slots pays for it.
        for tensor in engine.runner.pool.k + engine.runner.pool.v:
            tensor.zero_()
        for _ in range(cfg.rounds):
            prompt = rng.integers(3, engine.vocab_size, cfg.prefix_tokens).tolist()
            for source in ("recompute", "device", "disk (dropped)", "disk (page cache)"):
                if source == "disk (dropped)":
                    engine.tier.sync()
                    engine.flush_cache()
                    for path in folder.glob("*/seg-*.bin"):
                        fd = os.open(path, os.O_RDONLY)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.close(fd)
                elif source == "disk (page cache)":
                    engine.flush_cache()  # the read left the files in the page cache
                out = engine.generate(input_ids=prompt, sampling_params=FIRST)
                seconds.setdefault(source, []).append(out["meta_info"]["ttft_s"])
            engine.flush_cache()
            step("ttft")
    return [
        {"source": source, "prefix_tokens": cfg.prefix_tokens, "ttft_ms": 1000 * median(values)}
        | common.paired("vs_recompute", values, seconds["recompute"])
        for source, values in seconds.items()
    ]


def restart_rows(cfg: TiersBenchConfig, folder: Path, step: Step) -> list[dict]:
    rng = np.random.default_rng(cfg.seed + 1)
    options = dict(
        page_size=cfg.page_size, disk_cache_dir=str(folder), write_policy="write_through"
    )
    rows, prompts = [], None
    for label, passes in (("before", 2), ("after", 1)):
        with Engine(cfg.model, **options) as engine:
            if prompts is None:
                system = rng.integers(3, engine.vocab_size, cfg.system_tokens).tolist()
                users = rng.integers(3, engine.vocab_size, (cfg.restart_requests, cfg.user_tokens))
                prompts = [system + u for u in users.tolist()]
            for _ in range(passes):
                outs = [
                    engine.generate(input_ids=p, sampling_params=FIRST)["meta_info"]
                    for p in prompts
                ]
        hit = sum(o["cached_tokens"] for o in outs)
        disk = sum(o["cached_tokens_by_tier"]["disk"] for o in outs)
        rows.append({"engine": label, "hit_tokens": hit, "disk_hit_tokens": disk})
        step(f"restart {label}")
    rows[1]["of_before"] = rows[1]["hit_tokens"] / rows[0]["hit_tokens"]
    return rows


def run_tiers_bench(cfg: TiersBenchConfig, step: Step) -> dict:
    with tempfile.TemporaryDirectory(prefix="radixserve-tiers-") as tmp:
        ttft = ttft_rows(cfg, Path(tmp) / "ttft", step)
        return {"rows": ttft, "restart": restart_rows(cfg, Path(tmp) / "restart", step)}


TABLES = (
    TableSpec(
        "rows",
        "time to first token of one long prompt, by where its prefix comes from",
        (
            Column("source", "source"),
            Column("prefix_tokens", "prefix"),
            Column("ttft_ms", "TTFT ms", num(0)),
            Column("vs_recompute", "vs recompute", times),
        ),
    ),
    TableSpec(
        "restart",
        "the same requests before and after a restart on the same folder",
        (
            Column("engine", "engine"),
            Column("hit_tokens", "hit tokens"),
            Column("disk_hit_tokens", "from disk"),
            Column("of_before", "of before", pct),
        ),
    ),
)
QUICK = {"prefix_tokens": 256, "rounds": 1, "restart_requests": 2, "system_tokens": 64}


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_options(p, TiersBenchConfig, "prefix_tokens rounds")


def run(args: argparse.Namespace) -> int:
    cfg = common.configure(TiersBenchConfig, args, QUICK)
    result = common.with_progress(
        "bench tiers", cfg.rounds + 2, lambda step: run_tiers_bench(cfg, step)
    )
    return finish(args, cfg, result, TABLES)
