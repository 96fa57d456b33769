"""``radixserve demo``: a chat workload served with the prefix cache on and then off.

Many users share one long system prompt and hold two-turn conversations; each turn's prompt
is the chat-templated history so far, real model outputs included. The table shows what the
radix cache saves: prefill work, time to first token, throughput.
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
from rich.table import Table

from radixserve.bench.workloads import optimal_hit_rate
from radixserve.engine import Engine, SamplingParams
from radixserve.model.tokenizer import _corpus


@dataclass(frozen=True)
class DemoWorkload:
    users: int = 12
    turns: int = 2
    system_sentences: int = 24
    max_new_tokens: int = 16
    seed: int = 0

    def system_prompt(self) -> str:
        lines = _corpus(seed=self.seed + 1, lines=self.system_sentences)
        return "You are a careful assistant. Follow these notes:\n" + "\n".join(lines)

    def user_message(self, user: int, turn: int) -> str:
        rng = random.Random(self.seed * 1000 + user * 10 + turn)
        return " ".join(rng.choice(_corpus(seed=user, lines=8)) for _ in range(2))


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

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens


def serve(engine: Engine, work: DemoWorkload, label: str, progress: Progress) -> RunResult:
    params = SamplingParams(max_new_tokens=work.max_new_tokens, temperature=0, ignore_eos=True)
    history = [[{"role": "system", "content": work.system_prompt()}] for _ in range(work.users)]
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
    )


def run_demo(model: str, work: DemoWorkload, **engine_options) -> list[RunResult]:
    results = []
    with Progress(transient=True) as progress:
        for label, cache_on in (("on", True), ("off", False)):
            with Engine(model, enable_prefix_cache=cache_on, **engine_options) as engine:
                results.append(serve(engine, work, label, progress))
    return results


def print_results(
    model: str, work: DemoWorkload, results: list[RunResult], where: str = "cpu, float32"
) -> None:
    console = Console()
    console.print(
        f"[bold]radixserve demo[/]: model {model} ({where}), {work.users} users x "
        f"{work.turns} turns sharing one system prompt, {work.max_new_tokens} new tokens per reply"
    )
    table = Table()
    for header in (
        "cache",
        "requests",
        "hit rate",
        "TTFT p50",
        "TTFT p99",
        "tok/s",
        "time",
        "speedup",
    ):
        table.add_column(header, justify="right")
    off = results[-1].seconds
    for r in results:
        table.add_row(
            r.label,
            str(r.requests),
            f"{r.hit_rate:.1%}",
            f"{np.percentile(r.ttft, 50):.2f} s",
            f"{np.percentile(r.ttft, 99):.2f} s",
            f"{(r.prompt_tokens + r.output_tokens) / r.seconds:,.0f}",
            f"{r.seconds:.1f} s",
            f"{off / r.seconds:.2f}x",
        )
    console.print(table)
    console.print(
        "hit rate: prompt tokens served from the cache (the most this workload allows: "
        f"{results[0].optimal_hit_rate:.1%}); tok/s: prompt + output tokens"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bench-135m", help="a preset or a HF directory")
    p.add_argument("--users", type=int, default=12)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=16)
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
    results = run_demo(args.model, work, **options)
    print_results(args.model, work, results, where=f"{args.device}, {args.dtype}")
    return 0
