"""``radixserve bench spec``: speculative decoding off and on, side by side, on the real model.

Workloads (chat-templated, greedy, cache flushed before each run): ``questions``, the same
questions asked by several users in turn (drafts from the tree); ``rewrite``, code with a
name changed (n-gram drafts from the prompt); ``rag``, a sentence quoted from a passage;
``chat``, open-ended writing (little to draft: it must not slow down). Each runs with 1 and
with 8 requests in flight; off and on alternate round by round. A row is its median round;
the speedups are the medians of the paired rounds' ratios; ``same`` says whether every
output of every round equalled the off configuration's, token for token.
"""

from __future__ import annotations

import argparse
import inspect
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from radixserve.bench import common
from radixserve.bench.common import Step
from radixserve.engine import Engine, SamplingParams
from radixserve.model.tokenizer import corpus
from radixserve.tables import Column, TableSpec, finish, num, pct, times

QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What is photosynthesis?",
    "Who wrote Romeo and Juliet?",
    "Why is the sky blue?",
    "What is the boiling point of water?",
    "How do vaccines work?",
    "What is a prime number?",
    "What causes the seasons on Earth?",
    "What is the largest ocean?",
    "How does a rainbow form?",
    "What is gravity?",
    "What do bees make?",
    "What is the speed of light?",
    "How many continents are there?",
    "What is democracy?",
]
TOPICS = ["a lighthouse keeper", "a lost robot", "the first snow", "a dragon who bakes"]
TOPICS += ["a city under the sea", "an old violin", "a garden on Mars", "a talking cat"]
RENAMES = [("req", "request"), ("node", "vertex"), ("state", "st"), ("budget", "allowance")]


def _snippets() -> list[str]:
    """Functions of radixserve's own source (a few hundred tokens each) to rewrite."""
    from radixserve.cache.radix_edges import RadixEdges
    from radixserve.engine.scheduler.req_cache import ReqCacheManager
    from radixserve.engine.scheduler.scheduler import Scheduler
    from radixserve.engine.speculative.drafts import Drafter

    funcs = [Scheduler._schedule_decode, RadixEdges.continuation, Drafter.propose]
    funcs += [ReqCacheManager.admit, Scheduler._schedule_extend]
    return [inspect.getsource(f) for f in funcs]


def workload(name: str, n: int, questions: int, users: int) -> list[list[dict]]:
    """The chats of a workload, in the order they are sent."""
    ask = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    if name == "questions":
        return [ask(q) for _ in range(users) for q in QUESTIONS[:questions]]
    if name == "rewrite":
        code = _snippets()
        return [
            ask(f"Rewrite this Python code with `{old}` renamed to `{new}`:\n\n{code[i % 5]}")
            for i, (old, new) in zip(range(n), RENAMES * n, strict=False)
        ]
    if name == "rag":
        chats = []
        for i in range(n):
            passage = corpus(seed=500 + i, lines=12)
            word = passage[5].split()[2]
            text = "Passage:\n" + "\n".join(passage)
            chats.append(ask(f"{text}\n\nQuote the sentence of the passage with '{word}'."))
        return chats
    return [ask(f"Write a short story about {TOPICS[i % len(TOPICS)]}.") for i in range(n)]


WORKLOADS = ("questions", "rewrite", "rag", "chat")


@dataclass(frozen=True)
class SpecBenchConfig:
    model: str = "smollm2-135m-instruct"
    quantize: str = "none"  # float32 weights: the targets are stated there
    workloads: tuple[str, ...] = WORKLOADS
    concurrency: tuple[int, ...] = (1, 8)
    requests: int = 8  # per workload, but questions
    questions: int = 16  # each asked by every user in turn
    users: int = 4
    max_tokens: int = 96
    speculative_tokens: int = 6
    rounds: int = 2
    seed: int = 0


def run_once(engine: Engine, chats: list, concurrency: int, cfg: SpecBenchConfig) -> dict:
    params = SamplingParams(max_new_tokens=cfg.max_tokens, temperature=0)
    ids = [engine.apply_chat_template(c, add_generation_prompt=True) for c in chats]
    assert engine.flush_cache()

    def one(x: list[int]) -> dict:
        return engine.generate(input_ids=x, sampling_params=params)

    with ThreadPoolExecutor(concurrency) as pool:
        outs, seconds, delta = common.timed(engine, lambda: list(pool.map(one, ids)))
    tokens = sum(len(o["token_ids"]) for o in outs)
    return {
        "seconds": seconds,
        "tok_s": tokens / seconds,
        "decode_tok_s": delta["decode_tokens"] / delta["decode_s"],
        "drafted": delta["draft_tokens"],
        "accepted": delta["accepted_tokens"] / max(delta["draft_tokens"], 1),
        "per_verify": delta["accepted_tokens"] / max(delta["verify_steps"], 1),
        "outputs": [o["token_ids"] for o in outs],
    }


def run_spec_bench(cfg: SpecBenchConfig, step: Step = lambda label: None) -> dict:
    options = dict(quantize=cfg.quantize, page_size=16, seed=cfg.seed)
    engines = {
        "off": Engine(cfg.model, **options),
        "on": Engine(
            cfg.model, speculative="ngram", speculative_tokens=cfg.speculative_tokens, **options
        ),
    }
    rows, pairs = [], []
    try:
        for name in cfg.workloads:
            chats = workload(name, cfg.requests, cfg.questions, cfg.users)
            for c in cfg.concurrency:
                run = lambda k, chats=chats, c=c: run_once(engines[k], chats, c, cfg)  # noqa: E731
                runs = common.run_rounds(list(engines), cfg.rounds, run, step)
                same = all(r["outputs"] == runs["off"][0]["outputs"] for r in runs["on"])
                for label, rounds in runs.items():
                    row = {k: v for k, v in common.median_round(rounds).items() if k != "outputs"}
                    rows.append({"workload": name, "concurrency": c, "config": label, **row})
                off, on = runs["off"], runs["on"]
                pair = {"workload": name, "concurrency": c, "same": "yes" if same else "NO"}
                pair |= common.paired("speedup", off, on, "seconds")
                pairs.append(pair | common.paired("decode", on, off, "decode_tok_s"))
    finally:
        for engine in engines.values():
            engine.shutdown()
    return {"rows": rows, "pairs": pairs}


TABLES = (
    TableSpec(
        "rows",
        "speculative decoding off and on (median round)",
        (
            Column("workload", "workload"),
            Column("concurrency", "in flight"),
            Column("config", "spec"),
            Column("tok_s", "out tok/s", num(1)),
            Column("decode_tok_s", "decode tok/s", num(1)),
            Column("drafted", "drafted", wide=True),
            Column("accepted", "accepted", pct),
            Column("per_verify", "kept/step", num(2)),
        ),
    ),
    TableSpec(
        "pairs",
        "on over off, paired rounds: median (min-max)",
        (
            Column("workload", "workload"),
            Column("concurrency", "in flight"),
            Column("decode", "decode tok/s", times),
            Column("decode_min", "min", times),
            Column("decode_max", "max", times),
            Column("speedup", "end to end", times),
            Column("same", "same tokens"),
        ),
    ),
)
QUICK = {
    "requests": 2,
    "questions": 2,
    "users": 2,
    "max_tokens": 24,
    "rounds": 1,
    "concurrency": (1, 2),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    names = "quantize workloads concurrency requests questions users max_tokens"
    names += " speculative_tokens rounds"
    common.add_options(p, SpecBenchConfig, names)


def run(args: argparse.Namespace) -> int:
    cfg = common.configure(SpecBenchConfig, args, QUICK)
    total = len(cfg.workloads) * len(cfg.concurrency) * 2 * cfg.rounds
    data = common.with_progress("bench spec", total, lambda step: run_spec_bench(cfg, step))
    failed = finish(args, cfg, data, TABLES)
    if any(p["same"] != "yes" for p in data["pairs"]):
        print("speculative decoding changed greedy outputs")
        return 1
    return failed
