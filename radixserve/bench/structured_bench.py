"""``radixserve bench structured``: JSON extraction after the SGLang paper's workload (one
shared document, a schema per request with fixed keys) decoded three ways on one engine:
``constrained`` (the schema's bitmask on every step), ``jump-forward`` (forced text appended
as one extend chunk) and ``free`` (no grammar, held to the constrained output's lengths: the
same decode work without the masks). Configurations alternate round by round.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass

from radixserve.bench import common
from radixserve.bench.common import Step
from radixserve.engine import Engine, SamplingParams
from radixserve.model.tokenizer import corpus
from radixserve.tables import Column, TableSpec, finish, num, pct, plot, times

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
    document_lines: int = 80  # of the tokenizer's corpus: ~1,000 tokens shared by every prompt
    fields: int = 6  # keys per schema, drawn from FIELDS in a per-request order
    max_tokens: int = 160
    page_size: int = 16
    rounds: int = 2
    seed: int = 0


def workload(cfg: StructuredBenchConfig) -> tuple[list[str], list[dict]]:
    """Prompts (the document, then which record to extract) and one schema per request."""
    rng = random.Random(cfg.seed)
    document = "\n".join(corpus(seed=cfg.seed + 5, lines=cfg.document_lines))
    prompts = [
        f"{document}\n\nExtract record {i} of the text above as JSON:\n"
        for i in range(cfg.requests)
    ]
    schemas = []
    for _ in range(cfg.requests):
        keys = rng.sample(sorted(FIELDS), cfg.fields)
        properties = {k: FIELDS[k] for k in keys}
        schemas.append(
            {
                "type": "object",
                "properties": properties,
                "required": keys,
                "additionalProperties": False,
            }
        )
    return prompts, schemas


def valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def run_once(engine: Engine, cfg, label: str, lengths: list[int] = ()) -> dict:
    """One pass of every request, from an empty cache (``free``: held to ``lengths``)."""
    prompts, schemas = workload(cfg)
    if label == "free":
        params = [SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
    else:
        jump = label == "jump-forward"
        params = [
            SamplingParams(
                max_new_tokens=cfg.max_tokens, temperature=0, json_schema=s, jump_forward=jump
            )
            for s in schemas
        ]
    engine.flush_cache()
    outs, seconds, grown = common.timed(engine, lambda: engine.generate(prompts, params))
    steps = grown["scheduler_steps"]
    tokens = [o["meta_info"]["completion_tokens"] for o in outs]
    return {
        "config": label,
        "seconds": seconds,
        "lengths": tokens,
        "output_tokens": sum(tokens),
        "ms_per_token": 1000 * seconds / sum(tokens),
        "steps": steps,
        "mask_ms_per_step": 1000 * grown["grammar_wait_s"] / steps,
        "jumped_tokens": grown["jump_forward_tokens"],
        "valid": sum(valid(o["text"], s) for o, s in zip(outs, schemas, strict=True)) / len(outs),
    }


def run_structured_bench(cfg: StructuredBenchConfig, step: Step) -> list[dict]:
    # steps sized by the token budget alone: an ITL ratio sizes them by measured time, and
    # the free runs must take the very steps the constrained ones took
    options = dict(page_size=cfg.page_size, seed=cfg.seed, itl_ratio=None)
    with Engine(cfg.model, **options) as engine:
        # warm-up: compiles every schema and fixes the lengths the free runs are held to
        lengths = run_once(engine, cfg, "constrained")["lengths"]
        step("warm-up")
        runs = common.run_rounds(
            CONFIGS, cfg.rounds, lambda c: run_once(engine, cfg, c, lengths), step
        )
    for r in (r for rounds in runs.values() for r in rounds):
        del r["lengths"]
    constrained_steps = common.median_round(runs["constrained"])["steps"]
    return [
        common.median_round(runs[label])
        | common.paired("vs_free", runs[label], runs["free"], "seconds")
        | common.paired("speedup", runs["constrained"], runs[label], "seconds")
        | {"steps_vs_constrained": common.median_round(runs[label])["steps"] / constrained_steps}
        for label in CONFIGS
    ]


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
        ),
    ),
)
QUICK = {"requests": 3, "document_lines": 8, "fields": 3, "max_tokens": 48, "rounds": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_options(p, StructuredBenchConfig, "requests rounds", plot=True)


def run(args: argparse.Namespace) -> int:
    cfg = common.configure(StructuredBenchConfig, args, QUICK)
    total = 1 + len(CONFIGS) * cfg.rounds
    rows = common.with_progress(
        "bench structured", total, lambda step: run_structured_bench(cfg, step)
    )

    def chart(path: str) -> None:
        plot(path, rows, "config", ["steps", "seconds"], "config", bars=True)

    return finish(args, cfg, {"rows": rows}, TABLES, chart)
