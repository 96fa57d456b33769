"""``radixserve bench structured``: JSON extraction after the SGLang paper's workload — one
shared document, a schema per request with fixed keys — decoded three ways on one engine:

- ``constrained``: the schema's bitmask on every step, one decode step per token;
- ``jump-forward``: the same, with forced text (keys, braces, separators) appended and
  computed as one extend chunk;
- ``free``: no grammar, each request held to the length of its constrained output
  (``ignore_eos``), so it does the same decode work without the masks: the mask overhead is
  the constrained time over this one.

Configurations alternate round by round, the cache flushed before each run; a row is the
median round, its ratios the median of the paired rounds with their min-max.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

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
from radixserve.bench.timing import alternating, median_round, paired
from radixserve.engine import Engine, SamplingParams
from radixserve.model.tokenizer import _corpus

CONFIGS = ("constrained", "jump-forward", "free")
FIELDS = {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 12},
    "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
    "member": {"type": "boolean"},
    "tier": {"enum": ["gold", "silver", "bronze"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    "zip_code": {"type": "integer", "minimum": 10000, "maximum": 99999},
    "phone_number": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"},
    "date_of_birth": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
}


@dataclass(frozen=True)
class StructuredBenchConfig:
    model: str = "bench-135m"
    requests: int = 16
    document_lines: int = 80  # of the synthetic corpus: ~1,000 tokens shared by every prompt
    fields: int = 6  # keys per schema, drawn from FIELDS in a per-request order
    max_tokens: int = 160
    page_size: int = 16
    rounds: int = 2
    seed: int = 0


def workload(cfg: StructuredBenchConfig) -> tuple[list[str], list[dict]]:
    """Prompts (the document, then which record to extract) and one schema per request."""
    rng = random.Random(cfg.seed)
    document = "\n".join(_corpus(seed=cfg.seed + 5, lines=cfg.document_lines))
    prompts, schemas = [], []
    for i in range(cfg.requests):
        keys = rng.sample(sorted(FIELDS), cfg.fields)
        schema = {
            "type": "object",
            "properties": {k: FIELDS[k] for k in keys},
            "required": keys,
            "additionalProperties": False,
        }
        prompts.append(f"{document}\n\nExtract record {i} of the text above as JSON:\n")
        schemas.append(schema)
    return prompts, schemas


def params_for(
    cfg: StructuredBenchConfig, label: str, schemas: list[dict], lengths: list[int]
) -> list[SamplingParams]:
    if label == "free":
        return [SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
    jump = label == "jump-forward"
    return [
        SamplingParams(
            max_new_tokens=cfg.max_tokens, temperature=0, json_schema=s, jump_forward=jump
        )
        for s in schemas
    ]


def valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def run_once(engine: Engine, prompts: list[str], schemas: list[dict], params) -> dict:
    engine.flush_cache()
    before = engine.cache_stats()
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    after = engine.cache_stats()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    steps = after["scheduler_steps"] - before["scheduler_steps"]
    mask_s = after["grammar_wait_s"] - before["grammar_wait_s"]
    return {
        "seconds": seconds,
        "output_tokens": tokens,
        "tokens_s": tokens / seconds,
        "ms_per_token": 1000 * seconds / tokens,
        "steps": steps,
        "mask_ms_per_step": 1000 * mask_s / steps,
        "jumped_tokens": after["jump_forward_tokens"] - before["jump_forward_tokens"],
        "valid": sum(valid(o["text"], s) for o, s in zip(outs, schemas, strict=True)) / len(outs),
        "lengths": [o["meta_info"]["completion_tokens"] for o in outs],
    }


def run_structured_bench(cfg: StructuredBenchConfig, step: Callable[[str], None]) -> list[dict]:
    prompts, schemas = workload(cfg)
    options = dict(page_size=cfg.page_size, seed=cfg.seed)
    with Engine(cfg.model, **options) as engine:
        # warm-up: compiles every schema and fixes the lengths the free run is held to
        lengths = run_once(engine, prompts, schemas, params_for(cfg, "constrained", schemas, []))
        lengths = lengths["lengths"]
        step("warm-up")
        rounds: dict[str, list[dict]] = {label: [] for label in CONFIGS}
        for label in alternating(CONFIGS, cfg.rounds):
            params = params_for(cfg, label, schemas, lengths)
            rounds[label].append(run_once(engine, prompts, schemas, params))
            step(label)
    rows = []
    seconds = {label: [r["seconds"] for r in runs] for label, runs in rounds.items()}
    for label, runs in rounds.items():
        row = {"config": label, **median_round(runs)}
        del row["lengths"]
        vs_free = paired(seconds[label], seconds["free"])
        vs_constrained = paired(seconds["constrained"], seconds[label])
        row |= {
            "vs_free": vs_free["median"],
            "vs_free_min": vs_free["min"],
            "vs_free_max": vs_free["max"],
            "speedup": vs_constrained["median"],
            "speedup_min": vs_constrained["min"],
            "speedup_max": vs_constrained["max"],
            "steps_vs_constrained": row["steps"] / median_round(rounds["constrained"])["steps"],
        }
        rows.append(row)
    return rows


TABLES = (
    TableSpec(
        "rows",
        "JSON extraction: constrained, jump-forward, free",
        (
            Column("config", "config"),
            Column("steps", "steps"),
            Column("steps_vs_constrained", "steps vs constrained", pct, wide=True),
            Column("ms_per_token", "ms/token", num(1)),
            Column("vs_free", "vs free", times),
            Column("speedup", "speedup", times),
            Column("valid", "valid", pct),
            Column("mask_ms_per_step", "mask ms/step", num(2), wide=True),
            Column("jumped_tokens", "jumped", wide=True),
            Column("output_tokens", "tokens", wide=True),
        ),
    ),
)
QUICK = {"requests": 3, "document_lines": 8, "fields": 3, "max_tokens": 48, "rounds": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bench-135m", help="any model argument (docs/models.md)")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="a small batch, for smoke tests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", help="write a PNG chart here")


def run(args: argparse.Namespace) -> int:
    cfg = StructuredBenchConfig(
        model=args.model, requests=args.requests, rounds=args.rounds, seed=args.seed
    )
    if args.quick:
        cfg = replace(cfg, **QUICK)
    total = 1 + len(CONFIGS) * cfg.rounds
    rows = with_progress("bench structured", total, lambda step: run_structured_bench(cfg, step))
    return finish(
        args, cfg, {"rows": rows}, TABLES, lambda path: plots.plot_structured_bench(rows, path)
    )
