"""``radixserve demo``: a chat workload served with the prefix cache on and then off.

Many users share one long system prompt and hold two-turn conversations; each turn's prompt
is the chat-templated history so far, the model's answers included. By default the model is
a real one (SmolLM2-135M-Instruct, pulled on first run); the table shows what the radix
cache saves (prefill work, time to first token, throughput) and a few answers show the text.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.progress import Progress

from radixserve.engine import Engine, SamplingParams
from radixserve.model.pull import PullError, pull
from radixserve.sim.optimal import optimal_hit_rate
from radixserve.tables import Column, num, pct, print_table, times

DEFAULT_MODEL = "smollm2-135m-instruct"
FALLBACK_MODEL = "bench-135m"  # random weights: the same shape, no download

SYSTEM_NOTES = """You are the help desk of Northwind Library. Answer briefly and kindly.
Opening hours: Monday to Friday 9:00 to 20:00, Saturday 10:00 to 17:00, closed on Sunday.
Members borrow up to 12 items at a time. Books are lent for three weeks, films for one week.
A loan can be renewed twice online unless another member has reserved the item.
Late returns cost 20 cents a day for books and 1 euro a day for films, at most 10 euros.
Membership is free for residents; visitors pay 15 euros a year.
The reading room on the second floor is silent; group rooms can be booked for two hours.
Printing costs 10 cents a page in black and white and 50 cents in colour.
Wi-Fi is free: the network is Northwind-Guest and needs no password.
Children under 12 need a parent's signature to join.
Lost cards are replaced at the front desk for 2 euros."""

QUESTIONS = (
    "What is the capital of France?",
    "How many items can I borrow at once?",
    "Is the library open on Sunday?",
    "How much does it cost to print ten pages in colour?",
    "Can I renew a film online?",
    "What is the Wi-Fi network called?",
    "I lost my card. What should I do?",
    "How long can I keep a book?",
    "Give me one tip for studying well.",
    "How much is the fine for a book returned five days late?",
    "Can my eight-year-old daughter become a member?",
    "Write a haiku about reading.",
)
FOLLOW_UPS = ("Thank you! Can you say that in one short sentence?", "Why is that?")


@dataclass(frozen=True)
class DemoWorkload:
    users: int = 12
    turns: int = 2
    max_new_tokens: int = 32
    seed: int = 0

    def user_message(self, user: int, turn: int) -> str:
        if turn == 0:
            return QUESTIONS[user % len(QUESTIONS)]
        return random.Random(self.seed * 1000 + user * 10 + turn).choice(FOLLOW_UPS)


@dataclass(frozen=True)
class RunResult:
    label: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft: list[float]
    seconds: float
    optimal_hit_rate: float  # each distinct prefix computed once, with unlimited memory
    answers: list[tuple[str, str]]  # (first question, its answer) of each user

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens


def serve(engine: Engine, work: DemoWorkload, label: str, progress: Progress) -> RunResult:
    params = SamplingParams(max_new_tokens=work.max_new_tokens, temperature=0)
    history = [[{"role": "system", "content": SYSTEM_NOTES}] for _ in range(work.users)]
    metas, calls = [], []
    task = progress.add_task(label, total=work.users * work.turns)
    start = time.perf_counter()
    for turn in range(work.turns):
        prompts = []
        for user, messages in enumerate(history):
            messages.append({"role": "user", "content": work.user_message(user, turn)})
            prompts.append(engine.apply_chat_template(messages))

        async def run_turn(prompts=prompts) -> list[dict]:
            async def one(ids: list[int]) -> dict:
                out = await engine.async_generate(input_ids=ids, sampling_params=params)
                progress.advance(task)
                return out

            return await asyncio.gather(*(one(ids) for ids in prompts))

        outs = asyncio.run(run_turn())
        for messages, ids, out in zip(history, prompts, outs, strict=True):
            messages.append({"role": "assistant", "content": out["text"]})
            metas.append(out["meta_info"])
            calls.append((ids, out["token_ids"]))
    seconds = time.perf_counter() - start
    return RunResult(
        label=label,
        requests=len(metas),
        prompt_tokens=sum(m["prompt_tokens"] for m in metas),
        cached_tokens=sum(m["cached_tokens"] for m in metas),
        output_tokens=sum(m["completion_tokens"] for m in metas),
        ttft=[m["ttft_s"] for m in metas],
        seconds=seconds,
        optimal_hit_rate=optimal_hit_rate(calls, engine.config.page_size),
        answers=[(m[1]["content"], m[2]["content"]) for m in history],
    )


def run_demo(model: str, work: DemoWorkload, **engine_options) -> list[RunResult]:
    results = []
    with Progress(transient=True) as progress:
        for label, cache_on in (("on", True), ("off", False)):
            with Engine(model, enable_prefix_cache=cache_on, **engine_options) as engine:
                results.append(serve(engine, work, label, progress))
    return results


def print_results(
    model: str,
    work: DemoWorkload,
    results: list[RunResult],
    where: str = "cpu, float32",
    shown: int = 3,
) -> None:
    """The table, then ``shown`` of the users' first questions with the model's answers."""
    console = Console()
    console.print(
        f"[bold]radixserve demo[/]: model {model} ({where}), {work.users} users x "
        f"{work.turns} turns sharing one system prompt, {work.max_new_tokens} new tokens per reply"
    )
    off = results[-1].seconds
    rows = [
        {
            "cache": r.label,
            "requests": r.requests,
            "hit_rate": r.hit_rate,
            "ttft_p50": np.percentile(r.ttft, 50),
            "ttft_p99": np.percentile(r.ttft, 99),
            "tok_s": (r.prompt_tokens + r.output_tokens) / r.seconds,
            "seconds": r.seconds,
            "speedup": off / r.seconds,
        }
        for r in results
    ]
    print_table("", rows, COLUMNS)
    console.print(
        "hit rate: prompt tokens served from the cache (the most this workload allows: "
        f"{results[0].optimal_hit_rate:.1%}); tok/s: prompt + output tokens"
    )
    for question, answer in results[0].answers[:shown]:
        console.print(f"[bold]Q:[/] {question}\n[bold]A:[/] {' '.join(answer.split())}")


COLUMNS = (
    Column("cache", "cache"),
    Column("requests", "requests"),
    Column("hit_rate", "hit rate", pct),
    Column("ttft_p50", "TTFT p50 s", num(2)),
    Column("ttft_p99", "TTFT p99 s", num(2)),
    Column("tok_s", "tok/s", num(0)),
    Column("seconds", "time s", num(1)),
    Column("speedup", "speedup", times),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="a named model, GGUF file, HF directory or id, or a preset (bench-135m: random "
        "weights, no download)",
    )
    p.add_argument("--users", type=int, default=12)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--attention-backend", default="auto")


def run(args: argparse.Namespace) -> int:
    work = DemoWorkload(users=args.users, turns=args.turns, max_new_tokens=args.max_new_tokens)
    options = dict(
        page_size=args.page_size,
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
    )
    model = args.model
    if model == DEFAULT_MODEL:
        model = pulled_or_fallback(model)
    results = run_demo(model, work, **options)
    print_results(model, work, results, where=f"{args.device}, {args.dtype}")
    return 0


def pulled_or_fallback(name: str) -> str:
    """``name`` once pulled, or the random-weight preset when it cannot be (no network)."""
    try:
        pull(name)
    except PullError as exc:
        print(f"radixserve demo: could not pull {name}: {exc}")
        print(f"radixserve demo: running on {FALLBACK_MODEL} (random weights) instead")
        return FALLBACK_MODEL
    return name
