"""``radixserve bench lang``: DSL programs run with ``run_batch``, prefix cache on and off.

Every call a program makes is recorded, so the achieved token hit rate can be set next to
the optimal one (``optimal_hit_rate``). Cache on and off alternate round by round; each row
is its median round, and the speedup the median of the paired rounds' ratios.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from radixserve.bench import common
from radixserve.bench.common import Step
from radixserve.engine import Engine, SamplingParams
from radixserve.lang import EngineBackend, assistant, function, gen, system, user
from radixserve.model.tokenizer import corpus
from radixserve.sim.optimal import optimal_hit_rate
from radixserve.tables import Column, TableSpec, finish, num, pct, times


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
    rounds: int = 1
    programs: tuple[str, ...] = ("few-shot", "tree-of-thought")
    seed: int = 0

    def __post_init__(self) -> None:
        common.check_choices("program", self.programs, PROGRAMS)


class RecordingBackend(EngineBackend):
    """The engine backend, keeping every call's (prompt, output, cached length)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.calls: list[tuple[list[int], list[int], int]] = []
        self._lock = threading.Lock()

    def _record(self, input_ids: Sequence[int], out: dict) -> None:
        with self._lock:
            self.calls.append(
                (list(input_ids), out["token_ids"], out["meta_info"]["cached_tokens"])
            )

    def generate(self, input_ids, params, on_text=None) -> dict:
        out = super().generate(input_ids, params, on_text)
        self._record(input_ids, out)
        return out

    def score(self, context_ids, choices) -> list[dict]:
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


@function
def tree_of_thought(s, question, width, depth, max_tokens, seed):
    s += system("Think step by step. Propose one idea per step and keep it short.")
    s += user(question)
    frontier = [s]
    for level in range(depth):
        children = []
        for n, node in enumerate(frontier):
            for b, branch in enumerate(node.fork(width)):
                seed_b = seed * 1000 + level * 100 + n * width + b
                step = gen(
                    "step", max_tokens=max_tokens, temperature=0.8, ignore_eos=True, seed=seed_b
                )
                branch += assistant(step)
                branch += user(f"Go on from idea {b + 1}.")
                children.append(branch)
        frontier = children


def batch(cfg: LangBenchConfig, program: str) -> list[dict]:
    """Each program's arguments, from the tokenizer's corpus."""
    if program == "few-shot":
        n = cfg.few_shot_examples
        lines = corpus(seed=cfg.seed + 11, lines=2 * n + cfg.few_shot_questions)
        examples = [(lines[2 * i], lines[2 * i + 1]) for i in range(n)]
        return [
            {"examples": examples, "question": q, "max_tokens": cfg.max_tokens}
            for q in lines[2 * n :]
        ]
    shape = {"width": cfg.tot_width, "depth": cfg.tot_depth, "max_tokens": cfg.max_tokens}
    questions = corpus(seed=cfg.seed + 23, lines=cfg.tot_programs)
    return [{"question": q, "seed": i, **shape} for i, q in enumerate(questions)]


PROGRAMS = {"few-shot": few_shot, "tree-of-thought": tree_of_thought}


def run_once(cfg: LangBenchConfig, program: str, cache: str) -> dict:
    args = batch(cfg, program)
    options = dict(page_size=cfg.page_size, enable_prefix_cache=cache == "radix", seed=cfg.seed)
    with Engine(cfg.model, **options) as engine:
        engine.generate("warm up", SamplingParams(max_new_tokens=2))  # first-call costs
        engine.flush_cache()
        backend = RecordingBackend(engine)
        start = time.perf_counter()
        states = PROGRAMS[program].run_batch(args, backend=backend)
        seconds = time.perf_counter() - start
        engine.check_invariants()
    if failed := [s.error() for s in states if s.error() is not None]:
        raise RuntimeError(f"{program}: {len(failed)} programs failed, first: {failed[0]}")
    prompt = sum(len(ids) for ids, _, _ in backend.calls)
    hit = sum(cached for _, _, cached in backend.calls) / prompt
    optimal = optimal_hit_rate([(ids, out) for ids, out, _ in backend.calls], cfg.page_size)
    return {
        "program": program,
        "cache": cache,
        "programs": len(args),
        "calls": len(backend.calls),
        "prompt_tokens": prompt,
        "seconds": seconds,
        "programs_s": len(args) / seconds,
        "hit_rate": hit,
        "optimal_hit_rate": optimal,
        "of_optimal": hit / optimal if optimal else float("nan"),
    }


def run_lang_bench(cfg: LangBenchConfig, step: Step) -> list[dict]:
    rows = []
    for program in cfg.programs:
        runs = common.run_rounds(
            ["radix", "off"], cfg.rounds, partial(run_once, cfg, program), step
        )
        for rounds in runs.values():
            speedup = common.paired("speedup", runs["off"], rounds, "seconds")
            rows.append(common.median_round(rounds) | speedup)
    return rows


TABLES = (
    TableSpec(
        "rows",
        "DSL programs with run_batch",
        (
            Column("program", "program"),
            Column("cache", "cache"),
            Column("calls", "calls"),
            Column("programs_s", "programs/s", num(2)),
            Column("speedup", "speedup", times),
            Column("hit_rate", "hit rate", pct),
            Column("optimal_hit_rate", "optimal", pct),
            Column("of_optimal", "of optimal", pct, wide=True),
        ),
    ),
)
QUICK = {"few_shot_questions": 12, "tot_programs": 2, "tot_width": 2, "max_tokens": 4}


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_options(p, LangBenchConfig, "programs rounds")


def run(args: argparse.Namespace) -> int:
    cfg = common.configure(LangBenchConfig, args, QUICK)
    total = len(cfg.programs) * 2 * cfg.rounds
    rows = common.with_progress("bench lang", total, lambda step: run_lang_bench(cfg, step))
    return finish(args, cfg, {"rows": rows}, TABLES)
