"""``radixserve bench tiers``: what the disk tier buys on one machine.

- **ttft**: the time to first token of a long prompt (4,096 tokens by default) served four
  ways, round by round on a fresh prompt each: recomputed (its first time, written through
  to disk), from the KV pool (again), from disk with its files dropped from the OS page
  cache (``posix_fadvise``, the closest to a cold disk without root; ``flush_cache`` drops
  the pool's copy first), and from disk again, the files now in the page cache. The ratio
  is each over recomputing, paired by round (median, min-max).
- **chat**: multi-turn chats over per-conversation documents (of two lengths) whose working
  set is about four times the KV pool, served with the disk tier and without, alternating:
  a turn that comes back to a conversation after the pool dropped it reads it from disk
  instead of recomputing it.
- **restart**: requests sharing a system prompt served twice by one engine (the second
  pass is a warm engine's hits), then once by a new engine on the same folder: the share of
  the warm engine's hits the new one gets from its first requests.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

import numpy as np

from radixserve.bench.report import (
    Column,
    TableSpec,
    finish,
    num,
    pct,
    times,
    with_progress,
)
from radixserve.bench.timing import alternating, median_round, paired
from radixserve.bench.workloads import MultiTurnChat
from radixserve.cache import RadixCache
from radixserve.engine import Engine, SamplingParams

SOURCES = ("recompute", "device", "disk (dropped)", "disk (page cache)")
FIRST = SamplingParams(max_new_tokens=1, temperature=0)


@dataclass(frozen=True)
class ChatShape:
    conversations: int
    document: int  # tokens each conversation opens with
    pool: int  # KV slots, a quarter of the chat's working set
    running: int  # requests running at once: what the pool holds of the longest


@dataclass(frozen=True)
class TiersBenchConfig:
    model: str = "bench-135m"
    prefix_tokens: int = 4096
    rounds: int = 3
    restart_requests: int = 8
    chat_shapes: tuple[ChatShape, ...] = (ChatShape(16, 640, 4096, 4), ChatShape(8, 2048, 4864, 2))
    chat_turns: int = 6
    chat_rounds: int = 2
    system_tokens: int = 1024
    user_tokens: int = 64
    page_size: int = 16
    seed: int = 0


def drop_page_cache(folder: Path) -> None:
    for path in folder.glob("*/seg-*.bin"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def ttft_rows(cfg: TiersBenchConfig, folder: Path, step: Callable[[str], None]) -> list[dict]:
    rng = np.random.default_rng(cfg.seed)
    options = dict(
        page_size=cfg.page_size, disk_cache_dir=str(folder), write_policy="write_through"
    )
    seconds: dict[str, list[float]] = {s: [] for s in SOURCES}
    with Engine(cfg.model, max_total_tokens=4 * cfg.prefix_tokens, **options) as engine:
        engine.generate("warm up", FIRST)
        # The pool comes from calloc: its pages fault in on first write. Touch them all, or
        # whichever source first lands in untouched slots pays for it.
        for tensor in engine.runner.pool.k + engine.runner.pool.v:
            tensor.zero_()
        vocab = engine.vocab_size
        for _ in range(cfg.rounds):
            prompt = rng.integers(3, vocab, cfg.prefix_tokens).tolist()

            def ttft(prompt=prompt) -> float:
                return engine.generate(input_ids=prompt, sampling_params=FIRST)["meta_info"][
                    "ttft_s"
                ]

            seconds["recompute"].append(ttft())
            seconds["device"].append(ttft())
            engine.tier.sync()
            engine.flush_cache()
            drop_page_cache(folder)
            seconds["disk (dropped)"].append(ttft())
            engine.flush_cache()  # the read left the files in the page cache
            seconds["disk (page cache)"].append(ttft())
            engine.flush_cache()
            step("ttft")
    rows = []
    for source, values in seconds.items():
        ratio = paired(values, seconds["recompute"])
        rows.append(
            {
                "source": source,
                "prefix_tokens": cfg.prefix_tokens,
                "ttft_ms": 1000 * median(values),
                "vs_recompute": ratio["median"],
                "vs_recompute_min": ratio["min"],
                "vs_recompute_max": ratio["max"],
            }
        )
    return rows


def restart_rows(cfg: TiersBenchConfig, folder: Path, step: Callable[[str], None]) -> list[dict]:
    rng = np.random.default_rng(cfg.seed + 1)
    options = dict(
        page_size=cfg.page_size, disk_cache_dir=str(folder), write_policy="write_through"
    )
    rows = []
    prompts = None
    for label in ("before", "after"):
        with Engine(cfg.model, **options) as engine:
            if prompts is None:
                system = rng.integers(3, engine.vocab_size, cfg.system_tokens).tolist()
                prompts = [
                    system + rng.integers(3, engine.vocab_size, cfg.user_tokens).tolist()
                    for _ in range(cfg.restart_requests)
                ]
            passes = 2 if label == "before" else 1
            for _ in range(passes):
                outs = [engine.generate(input_ids=p, sampling_params=FIRST) for p in prompts]
        hit = sum(o["meta_info"]["cached_tokens"] for o in outs)
        disk = sum(o["meta_info"]["cached_tokens_by_tier"]["disk"] for o in outs)
        rows.append({"engine": label, "hit_tokens": hit, "disk_hit_tokens": disk})
        step(f"restart {label}")
    rows[1]["of_before"] = rows[1]["hit_tokens"] / rows[0]["hit_tokens"]
    return rows


def chat_once(cfg: TiersBenchConfig, shape: ChatShape, folder: Path | None, vocab: int) -> dict:
    chat = MultiTurnChat(  # one "system prompt" per conversation: its own document
        num_system_prompts=shape.conversations,
        system_prompt_len=shape.document,
        num_conversations=shape.conversations,
        turns=cfg.chat_turns,
        user_len=48,
        output_len=16,
        vocab_size=vocab,
        seed=cfg.seed,
    )
    waves: dict[int, list] = {}
    for req in chat.requests():
        waves.setdefault(req.wave, []).append(req)
    options = dict(
        page_size=cfg.page_size,
        max_total_tokens=shape.pool,
        max_running_requests=shape.running,
    )
    if folder is not None:
        options["disk_cache_dir"] = str(folder)
    with Engine(cfg.model, **options) as engine:
        start = time.perf_counter()
        outs = []
        for wave in waves.values():
            params = [
                SamplingParams(max_new_tokens=r.max_tokens, temperature=0, ignore_eos=True)
                for r in wave
            ]
            outs += engine.generate(
                input_ids=[r.prompt.tolist() for r in wave], sampling_params=params
            )
        seconds = time.perf_counter() - start
        stats = engine.cache_stats()
    tree = RadixCache(1, native_matcher=False)  # distinct prefix tokens: the working set
    for wave in waves.values():
        for r in wave:
            tree.insert(r.sequence, np.zeros(len(r.sequence), dtype=np.int64))
    working = tree.total_size
    return {
        "config": "disk tier" if folder is not None else "pool only",
        "document": shape.document,
        "requests": len(outs),
        "kv_pool": shape.pool,
        "working_set": working,
        "seconds": seconds,
        "requests_s": len(outs) / seconds,
        "hit_rate": stats["token_hit_rate"],
        "disk_hit_tokens": stats.get("disk_hit_tokens", 0),
    }


def chat_rows(cfg: TiersBenchConfig, folder: Path, step: Callable[[str], None]) -> list[dict]:
    with Engine(cfg.model, max_total_tokens=4 * cfg.page_size) as probe:
        vocab = probe.vocab_size
    rows = []
    for n, shape in enumerate(cfg.chat_shapes):
        runs: dict[str, list[dict]] = {"disk tier": [], "pool only": []}
        for r, label in enumerate(alternating(list(runs), cfg.chat_rounds)):
            tier = folder / f"{n}-{r}" if label == "disk tier" else None
            runs[label].append(chat_once(cfg, shape, tier, vocab))
            step(f"chat {label}")
        slow = [r["seconds"] for r in runs["pool only"]]
        for runs_of in runs.values():
            ratio = paired(slow, [r["seconds"] for r in runs_of])
            rows.append(
                {
                    **median_round(runs_of),
                    "speedup": ratio["median"],
                    "speedup_min": ratio["min"],
                    "speedup_max": ratio["max"],
                }
            )
    return rows


def run_tiers_bench(cfg: TiersBenchConfig, step: Callable[[str], None]) -> dict:
    with tempfile.TemporaryDirectory(prefix="radixserve-tiers-") as tmp:
        ttft = ttft_rows(cfg, Path(tmp) / "ttft", step)
        chat = chat_rows(cfg, Path(tmp) / "chat", step)
        restart = restart_rows(cfg, Path(tmp) / "restart", step)
    return {"rows": ttft, "chat": chat, "restart": restart}


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
        "chat",
        "multi-turn chats over documents, four times the pool, with the disk tier and without",
        (
            Column("config", "config"),
            Column("document", "document"),
            Column("working_set", "working set"),
            Column("kv_pool", "KV pool"),
            Column("requests_s", "req/s", num(2)),
            Column("speedup", "speedup", times),
            Column("hit_rate", "hit rate", pct),
            Column("disk_hit_tokens", "from disk", wide=True),
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
QUICK = {
    "prefix_tokens": 256,
    "rounds": 1,
    "restart_requests": 2,
    "system_tokens": 64,
    "chat_shapes": (ChatShape(6, 128, 512, 3),),
    "chat_turns": 3,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bench-135m", help="any model argument (docs/models.md)")
    p.add_argument("--prefix-tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")


def run(args: argparse.Namespace) -> int:
    cfg = TiersBenchConfig(model=args.model, prefix_tokens=args.prefix_tokens, rounds=args.rounds)
    if args.quick:
        cfg = replace(cfg, **QUICK)
    total = cfg.rounds + 2 * cfg.chat_rounds * len(cfg.chat_shapes) + 2
    result = with_progress("bench tiers", total, lambda step: run_tiers_bench(cfg, step))
    return finish(args, cfg, result, TABLES)
