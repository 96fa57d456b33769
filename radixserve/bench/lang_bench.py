"""``radixserve bench lang``: DSL programs run with ``run_batch``, prefix cache on and off.

Every call a program makes is recorded, so the achieved token hit rate can be set next to
the optimal one: each distinct prefix token computed once, with unlimited memory, where
tokens a decode step already computed (a reply the next call extends) count as computed.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

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
from radixserve.bench.workloads import optimal_hit_rate
from radixserve.engine import Engine, SamplingParams
from radixserve.lang import EngineBackend, assistant, function, gen, system, user
from radixserve.lang.backend import OnText
from radixserve.model.tokenizer import _corpus


@dataclass(frozen=True)
class LangBenchConfig:
    model: str = "bench-135m"
    few_shot_questions: int = 64
    few_shot_examples: int = 5
    tot_programs: int = 8
    tot_width: int = 3
    tot_depth: int = 2
    max_tokens: int = 16
    page_size: int = 1
    rounds: int = 1  # cache on/off alternate this many times
    seed: int = 0


@dataclass
class Call:
    input_ids: list[int]
    output_ids: list[int]
    cached_tokens: int


class RecordingBackend(EngineBackend):
    """The engine backend, keeping every call's prompt, output and cached length."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def _record(self, input_ids: Sequence[int], out: dict) -> None:
        call = Call(list(input_ids), out["token_ids"], out["meta_info"]["cached_tokens"])
        with self._lock:
            self.calls.append(call)

    def generate(
        self, input_ids: Sequence[int], params: SamplingParams, on_text: OnText | None = None
    ) -> dict:
        out = super().generate(input_ids, params, on_text)
        self._record(input_ids, out)
        return out

    def score(self, context_ids: Sequence[int], choices: Sequence[Sequence[int]]) -> list[dict]:
        outs = super().score(context_ids, choices)
        for choice, out in zip(choices, outs, strict=True):
            self._record([*context_ids, *choice], out)
        return outs


@function
def few_shot(s, examples, question, max_tokens):
    s += "Answer each question in one sentence.\n\n"
    for q, a in examples:
        s += f"Question: {q}\nAnswer: {a}\n\n"
    s += f"Question: {question}\nAnswer:"
    s += gen("answer", max_tokens=max_tokens, temperature=0, ignore_eos=True)


def few_shot_batch(cfg: LangBenchConfig) -> list[dict]:
    lines = _corpus(seed=cfg.seed + 11, lines=2 * cfg.few_shot_examples + cfg.few_shot_questions)
    examples = [(lines[2 * i], lines[2 * i + 1]) for i in range(cfg.few_shot_examples)]
    questions = lines[2 * cfg.few_shot_examples :]
    return [{"examples": examples, "question": q, "max_tokens": cfg.max_tokens} for q in questions]


@function
def tree_of_thought(s, question, width, depth, max_tokens, seed):
    s += system("Think step by step. Propose one idea per step and keep it short.")
    s += user(question)
    frontier = [s]
    for level in range(depth):
        children = []
        for n, node in enumerate(frontier):
            for b, branch in enumerate(node.fork(width)):
                step = gen(
                    "step",
                    max_tokens=max_tokens,
                    temperature=0.8,
                    ignore_eos=True,
                    seed=seed * 1000 + level * 100 + n * width + b,
                )
                branch += assistant(step)
                branch += user(f"Go on from idea {b + 1}.")
                children.append(branch)
        frontier = children


def tree_of_thought_batch(cfg: LangBenchConfig) -> list[dict]:
    questions = _corpus(seed=cfg.seed + 23, lines=cfg.tot_programs)
    return [
        {
            "question": q,
            "width": cfg.tot_width,
            "depth": cfg.tot_depth,
            "max_tokens": cfg.max_tokens,
            "seed": i,
        }
        for i, q in enumerate(questions)
    ]


PROGRAMS = {
    "few-shot": (few_shot, few_shot_batch),
    "tree-of-thought": (tree_of_thought, tree_of_thought_batch),
}


def run_once(cfg: LangBenchConfig, program: str, cache_on: bool) -> dict:
    fn, make_batch = PROGRAMS[program]
    batch = make_batch(cfg)
    options = dict(page_size=cfg.page_size, enable_prefix_cache=cache_on, seed=cfg.seed)
    with Engine(cfg.model, **options) as engine:
        engine.generate("warm up", SamplingParams(max_new_tokens=2))  # first-call costs
        engine.flush_cache()
        backend = RecordingBackend(engine)
        start = time.perf_counter()
        states = fn.run_batch(batch, backend=backend)
        seconds = time.perf_counter() - start
        engine.check_invariants()
    failed = [s.error() for s in states if s.error() is not None]
    if failed:
        raise RuntimeError(f"{program}: {len(failed)} programs failed, first: {failed[0]}")
    calls = backend.calls
    prompt = sum(len(c.input_ids) for c in calls)
    hit = sum(c.cached_tokens for c in calls) / prompt
    optimal = optimal_hit_rate([(c.input_ids, c.output_ids) for c in calls], cfg.page_size)
    return {
        "program": program,
        "cache": "radix" if cache_on else "off",
        "programs": len(batch),
        "calls": len(calls),
        "prompt_tokens": prompt,
        "output_tokens": sum(len(c.output_ids) for c in calls),
        "seconds": seconds,
        "programs_s": len(batch) / seconds,
        "hit_rate": hit,
        "optimal_hit_rate": optimal,
        "of_optimal": hit / optimal if optimal else float("nan"),
    }


def run_lang_bench(
    cfg: LangBenchConfig, programs: Sequence[str], step: Callable[[str], None]
) -> list[dict]:
    """Cache on and off alternate round by round; each row is its median round, and the
    speedup the median of the paired rounds' ratios (with their min-max)."""
    rows = []
    for program in programs:
        rounds: dict[str, list[dict]] = {"radix": [], "off": []}
        for label in alternating(["radix", "off"], cfg.rounds):
            rounds[label].append(run_once(cfg, program, label == "radix"))
            step(f"{program} cache {label}")
        off = [r["seconds"] for r in rounds["off"]]
        for runs in rounds.values():
            ratio = paired(off, [r["seconds"] for r in runs])
            row = median_round(runs)
            rows.append(
                {
                    **row,
                    "speedup": ratio["median"],
                    "speedup_min": ratio["min"],
                    "speedup_max": ratio["max"],
                }
            )
    return rows


TABLES = (
    TableSpec(
        "rows",
        "DSL programs with run_batch",
        (
            Column("program", "program"),
            Column("cache", "cache"),
            Column("programs", "programs", wide=True),
            Column("calls", "calls"),
            Column("prompt_tokens", "prompt tokens", wide=True),
            Column("programs_s", "programs/s", num(2)),
            Column("speedup", "speedup", times),
            Column("hit_rate", "hit rate", pct),
            Column("optimal_hit_rate", "optimal", pct),
            Column("of_optimal", "of optimal", pct, wide=True),
        ),
    ),
)
QUICK = {"few_shot_questions": 12, "tot_programs": 2, "tot_width": 2, "max_tokens": 4, "rounds": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bench-135m", help="any model argument (docs/models.md)")
    p.add_argument("--programs", nargs="+", default=["all"], help="few-shot, tree-of-thought")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="small batches, for smoke tests")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    cfg = LangBenchConfig(model=args.model, rounds=args.rounds, seed=args.seed)
    if args.quick:
        cfg = replace(cfg, **QUICK)
    programs = list(PROGRAMS) if args.programs == ["all"] else args.programs
    if unknown := set(programs) - set(PROGRAMS):
        raise ValueError(f"unknown programs {sorted(unknown)}; choose from {sorted(PROGRAMS)}")
    total = len(programs) * 2 * cfg.rounds
    rows = with_progress("bench lang", total, lambda step: run_lang_bench(cfg, programs, step))
    return finish(args, cfg, {"rows": rows}, TABLES)
