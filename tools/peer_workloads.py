"""Two OpenAI-compatible servers side by side on token-id prompts (ignore_eos, greedy),
alternating A B / B A round by round, fresh random prompts each round (the same for both):

  stream   one stream: decode tokens/s (64-token prompt, 256 out) and a fresh 512-token
           prompt's prefill tokens/s (to its first token)
  serving  32 x (1,024 shared + 64) tokens, 32 out; 16 users x 3 turns over a 600-token
           system prompt; 32 distinct 512-token prompts; 8 requests in flight

For llama.cpp's server against ours (docs/benchmarks.md); the servers are started apart:
  python tools/peer_workloads.py stream|serving URL_A=MODEL_A URL_B=MODEL_B [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

import httpx

TOKENS = (300, 40000)  # the ids prompts draw from (--vocab sets the top)


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKENS) for _ in range(n)]


def stream_times(url: str, model: str, ids: list[int], max_tokens: int) -> list[float]:
    """Seconds from sending to each streamed chunk."""
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "cache_prompt": False}  # fmt: skip
    start, times = time.perf_counter(), []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                times.append(time.perf_counter() - start)
    return times


def stream_round(url: str, model: str, rng: random.Random) -> dict[str, float]:
    times = stream_times(url, model, prompt(rng, 64), 256)
    first = stream_times(url, model, prompt(rng, 512), 1)[0]
    return {"decode tok/s": 255 / (times[-1] - times[0]), "prefill 512 tok/s": 512 / first}


async def complete(client: httpx.AsyncClient, url: str, model: str, ids: list[int]) -> None:
    body = {"model": model, "prompt": ids, "max_tokens": 32, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    (await client.post(url + "/v1/completions", json=body, timeout=600)).raise_for_status()


async def serving_workload(name: str, url: str, model: str, rng: random.Random) -> None:
    gate = asyncio.Semaphore(8)
    async with httpx.AsyncClient() as client:

        async def send(ids: list[int]) -> None:
            async with gate:
                await complete(client, url, model, ids)

        async def user(system: list[int]) -> None:
            ids = system + prompt(rng, 40)
            for _ in range(3):
                await send(ids)
                ids = ids + prompt(rng, 32) + prompt(rng, 40)  # the answer, the next question

        if name == "shared 1024+64":
            system = prompt(rng, 1024)
            await asyncio.gather(*[send(system + prompt(rng, 64)) for _ in range(32)])
        elif name == "3-turn chats":
            system = prompt(rng, 600)
            await asyncio.gather(*[user(system) for _ in range(16)])
        else:
            await asyncio.gather(*[send(prompt(rng, 512)) for _ in range(32)])


def serving_round(url: str, model: str, rng: random.Random) -> dict[str, float]:
    seconds = {}
    for name in ("shared 1024+64", "3-turn chats", "no sharing"):
        start = time.perf_counter()
        asyncio.run(serving_workload(name, url, model, rng))
        seconds[f"{name} s"] = time.perf_counter() - start
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["stream", "serving"])
    p.add_argument("servers", nargs=2, help="URL=MODEL")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vocab", type=int, default=40000, help="prompts' ids lie below it")
    args = p.parse_args()
    global TOKENS
    TOKENS = (min(300, args.vocab // 2), args.vocab)
    servers = [tuple(s.split("=", 1)) for s in args.servers]
    run = stream_round if args.kind == "stream" else serving_round
    rows: list[list[dict]] = [[], []]  # per server, per round
    for r in range(args.rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            url, model = servers[i]
            rows[i].append(run(url, model, random.Random(r)))
            print(f"round {r}: {url}: {json.dumps(rows[i][-1])}", flush=True)
    (a, _), (b, _) = servers
    for key in rows[0][0]:
        ratios = [x[key] / y[key] for x, y in zip(rows[0], rows[1], strict=True)]
        print(f"{key}: {a} / {b} = {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
