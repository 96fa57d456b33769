"""The streamed chat load the benchmarks put on a server over HTTP, and its summary.
``ServerProcess``, ``radixserve serve`` in a child process, starts the end-to-end tests'
servers too."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import median

import httpx
import numpy as np

from radixserve.model.tokenizer import corpus
from radixserve.server.app import SHUTDOWN_COMPLETE

# Where servers empty their prefix cache: ours and SGLang's, vLLM's (VLLM_SERVER_DEV_MODE=1)
FLUSH_ROUTES = ("/flush_cache", "/reset_prefix_cache")


@dataclass(frozen=True)
class ChatLoad:
    requests: int = 40
    concurrency: int = 64
    request_rate: float = 1.2  # requests per second (Poisson); inf sends all at once
    max_tokens: int = 48
    system_prompts: int = 4
    system_sentences: int = 24
    zipf: float = 0.0  # system prompts' popularity: rank k drawn in proportion to k^-zipf
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests < 1 or self.concurrency < 1 or self.max_tokens < 1:
            raise ValueError("requests, concurrency and max_tokens must be positive")
        if not self.request_rate > 0:
            raise ValueError("request_rate must be positive (inf sends all at once)")

    def chats(self) -> list[list[dict]]:
        """Each request: one of a few long system prompts, then a user's own question."""
        systems = [
            "You are a support assistant. Follow these notes:\n"
            + "\n".join(corpus(seed=100 + k, lines=self.system_sentences))
            for k in range(self.system_prompts)
        ]
        rng = random.Random(self.seed)
        weights = [(k + 1) ** -self.zipf for k in range(self.system_prompts)]

        def system() -> str:  # uniform draws kept as they were, so earlier runs repeat
            return rng.choices(systems, weights)[0] if self.zipf else rng.choice(systems)

        questions = corpus(seed=self.seed + 7, lines=self.requests)
        return [
            [
                {"role": "system", "content": system()},
                {"role": "user", "content": f"User {i}: {questions[i]}"},
            ]
            for i in range(self.requests)
        ]


@dataclass
class RequestRecord:
    """What one stream saw."""

    error: str = ""
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # the gaps between chunks
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


async def _stream_chat(client: httpx.AsyncClient, body: dict) -> RequestRecord:
    rec = RequestRecord()
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                rec.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    rec.error = event["error"]["message"]
                    return rec
                if u := event.get("usage"):
                    rec.prompt_tokens = u["prompt_tokens"]
                    rec.completion_tokens = u["completion_tokens"]
                    details = u.get("prompt_tokens_details") or {}  # vLLM: only if enabled
                    rec.cached_tokens = details.get("cached_tokens") or 0
                # Each chunk is one scheduler step's tokens; its text may be empty (a special
                # token, a held-back stop prefix), so arrival is timed by chunk, not by text.
                if event.get("choices"):
                    now = time.perf_counter()
                    if rec.ttft_s == 0.0:
                        rec.ttft_s = now - start
                    else:
                        rec.itl_s.append(now - last)
                    last = now
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        return rec
    if rec.completion_tokens == 0:
        rec.error = "stream ended without usage"
    return rec


def drive(
    url: str, load: ChatLoad, model: str | None = None, on_done: Callable[[], None] = lambda: None
) -> dict:
    """Send every chat at the load's rate and concurrency (``on_done`` after each): the
    summary of what the streams saw."""
    return summarize(*asyncio.run(_send(url, load, model, on_done)))


async def _send(
    url: str, load: ChatLoad, model: str | None, on_done: Callable[[], None]
) -> tuple[list[RequestRecord], float]:
    gate = asyncio.Semaphore(load.concurrency)
    rng = np.random.default_rng(load.seed)
    limits = httpx.Limits(max_connections=load.concurrency, max_keepalive_connections=0)
    body = {
        "max_tokens": load.max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # fixed output lengths make configurations comparable
        "stream": True,
        "stream_options": {"include_usage": True},
    } | ({} if model is None else {"model": model})
    async with httpx.AsyncClient(base_url=url, timeout=600.0, limits=limits) as client:

        async def one(messages: list[dict]) -> RequestRecord:
            async with gate:
                rec = await _stream_chat(client, {**body, "messages": messages})
            on_done()
            return rec

        start = time.perf_counter()
        tasks = []
        for messages in load.chats():
            tasks.append(asyncio.create_task(one(messages)))
            if load.request_rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / load.request_rate))
        records = await asyncio.gather(*tasks)
        return records, time.perf_counter() - start


def summarize(records: list[RequestRecord], seconds: float) -> dict:
    done = [r for r in records if not r.error]
    ttft = [r.ttft_s for r in done] or [float("nan")]
    itl = [x for r in done for x in r.itl_s] or [float("nan")]
    prompt = sum(r.prompt_tokens for r in done)
    return {
        "requests": len(records),
        "errors": len(records) - len(done),
        "seconds": seconds,
        "req_s": len(done) / seconds,
        "out_tok_s": sum(r.completion_tokens for r in done) / seconds,
        "ttft_p50_ms": 1000 * float(np.percentile(ttft, 50)),
        "ttft_p99_ms": 1000 * float(np.percentile(ttft, 99)),
        "itl_p50_ms": 1000 * float(np.percentile(itl, 50)),
        "itl_p99_ms": 1000 * float(np.percentile(itl, 99)),
        "hit_rate": sum(r.cached_tokens for r in done) / prompt if prompt else 0.0,
        "first_error": next((r.error for r in records if r.error), ""),
    }


def warm_and_flush(url: str, model: str | None = None, times: int = 1) -> bool:
    """``times`` short requests (first-call costs, compilation, stay out of the figures), then
    an empty prefix cache, so every round starts cold; False when no flush route answered."""
    warm = {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2}
    warm |= {} if model is None else {"model": model}
    for _ in range(times):
        httpx.post(url + "/v1/chat/completions", json=warm, timeout=300.0).raise_for_status()
    return any(httpx.post(url + r, timeout=60.0).status_code == 200 for r in FLUSH_ROUTES)


def median_row(label: str, runs: list[dict]) -> dict:
    """Each figure's median over ``runs``; errors summed; any round's failure is the row's."""
    row = {"config": label, "rounds": len(runs), "errors": sum(r["errors"] for r in runs)}
    for key, value in runs[0].items():
        if key == "errors":
            continue
        if isinstance(value, int | float):
            row[key] = median(r[key] for r in runs)
        else:
            row[key] = next((r[key] for r in runs if r[key] != value), value)
    return row


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``radixserve serve ARGS`` in a child process on a free loopback port (its own
    interpreter, signals and exit code), once ``/health`` answers; ``stop`` sends SIGTERM.
    Output goes to a file so a chatty server never blocks on a pipe."""

    def __init__(
        self, args: Sequence[str], startup_timeout_s: float = 180.0, env: dict | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fd, self.log_path = tempfile.mkstemp(prefix="radixserve-", suffix=".log")
        cmd = [sys.executable, "-m", "radixserve.cli", "serve", "--port", str(self.port), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env)
        os.close(fd)
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"server not healthy after {startup_timeout_s:.0f} s:\n{self.output()}")

    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout_s: float = 60.0) -> bool:
        """SIGTERM, then wait; True when the server shut down gracefully. Like most servers,
        uvicorn re-raises the signal once it has shut down, so the exit status is -SIGTERM."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return False
        return code in (0, -signal.SIGTERM) and SHUTDOWN_COMPLETE in self.output()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        os.unlink(self.log_path)
