"""Every counter and timer the engine keeps, in one place.

Written on the scheduler thread only; ``cache_stats()``, the server's ``/metrics`` and the
benchmarks read ``figures()`` taken there (``reports.py`` adds the cache's and the
scheduler's). Counters only grow (Prometheus counters must
not go down); the latency windows keep the most recent samples.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

WINDOW = 10_000


def _window() -> deque[float]:
    return deque(maxlen=WINDOW)


@dataclass
class EngineMetrics:
    started_s: float = field(default_factory=time.perf_counter)
    # prompt tokens at first admission (a preempted request's re-admission is not a query)
    queried_tokens: int = 0
    hit_tokens: int = 0
    host_hit_tokens: int = 0  # of hit_tokens, those copied back from the host tier
    disk_hit_tokens: int = 0  # of hit_tokens, those read back from the disk tier
    requests_admitted: int = 0
    requests_hit: int = 0
    preemptions: int = 0
    # forward passes; seconds in scheduling, in the model's forward and in decode passes
    steps: int = 0
    scheduler_s: float = 0.0
    forward_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens: int = 0
    prefill_budget_tokens: int = 0  # what the last step that prefilled was allowed
    mixed_steps: int = 0  # steps that carried decodes and prefill chunks together
    cascade_groups: int = 0  # prefix groups the attention backend ran
    cascade_saved_tokens: int = 0  # per layer: K/V rows not re-read thanks to them
    # structured output: seconds filling bitmasks (beside the forward pass) and waiting for
    # them and applying them (after it); tokens appended by jump-forward
    grammar_fill_s: float = 0.0
    grammar_wait_s: float = 0.0
    jump_forward_tokens: int = 0
    # speculative decoding: draft tokens proposed and accepted, by source (tree, ngram), and
    # the steps that verified a draft
    draft_tokens: dict[str, int] = field(default_factory=dict)
    accepted_tokens: dict[str, int] = field(default_factory=dict)
    verify_steps: int = 0
    finished_requests: int = 0
    generated_tokens: int = 0
    # seconds per admission lookup since the last cache flush (a property of what is cached)
    lookup_s: deque[float] = field(default_factory=_window)
    ttft_s: deque[float] = field(default_factory=_window)
    latency_s: deque[float] = field(default_factory=_window)

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.queried_tokens += prompt_tokens
        self.hit_tokens += cached_tokens
        self.requests_admitted += 1
        self.requests_hit += cached_tokens > 0

    def finished(self, completion_tokens: int, ttft_s: float | None, latency_s: float) -> None:
        self.finished_requests += 1
        self.generated_tokens += completion_tokens
        if ttft_s is not None:
            self.ttft_s.append(ttft_s)
            self.latency_s.append(latency_s)

    def figures(self) -> dict:
        """Every counter, rate and latency quantile kept here."""
        elapsed = time.perf_counter() - self.started_s
        ttft, latency = _quantiles(self.ttft_s), _quantiles(self.latency_s)
        lookup = _quantiles(self.lookup_s)
        return {
            "queried_tokens": self.queried_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": _ratio(self.hit_tokens, self.queried_tokens),
            "host_hit_tokens": self.host_hit_tokens,
            "disk_hit_tokens": self.disk_hit_tokens,
            "request_hit_rate": _ratio(self.requests_hit, self.requests_admitted),
            "preemptions": self.preemptions,
            "scheduler_steps": self.steps,
            "scheduler_s": self.scheduler_s,
            "forward_s": self.forward_s,
            "decode_s": self.decode_s,
            "decode_tokens": self.decode_tokens,
            "prefill_budget_tokens": self.prefill_budget_tokens,
            "mixed_steps": self.mixed_steps,
            "cascade_groups": self.cascade_groups,
            "cascade_saved_tokens": self.cascade_saved_tokens,
            "grammar_fill_s": self.grammar_fill_s,
            "grammar_wait_s": self.grammar_wait_s,
            "jump_forward_tokens": self.jump_forward_tokens,
            **self._speculation(),
            "finished_requests": self.finished_requests,
            "generated_tokens": self.generated_tokens,
            "generation_throughput": self.generated_tokens / elapsed,
            "ttft_p50_s": ttft[0],
            "ttft_p99_s": ttft[1],
            "latency_p50_s": latency[0],
            "latency_p99_s": latency[1],
            "lookup_p50_us": 1e6 * lookup[0],
            "lookup_p99_us": 1e6 * lookup[1],
        }

    def _speculation(self) -> dict:
        out = {}
        for source in ("tree", "ngram"):
            out[f"draft_tokens_{source}"] = self.draft_tokens.get(source, 0)
            out[f"accepted_tokens_{source}"] = self.accepted_tokens.get(source, 0)
        accepted = sum(self.accepted_tokens.values())
        out["draft_tokens"] = sum(self.draft_tokens.values())
        out["accepted_tokens"] = accepted
        out["verify_steps"] = self.verify_steps
        out["mean_accepted_length"] = _ratio(accepted, self.verify_steps)
        return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _quantiles(samples: deque[float]) -> tuple[float, float]:
    if not samples:
        return 0.0, 0.0
    p50, p99 = np.percentile(np.fromiter(samples, float), [50, 99])
    return float(p50), float(p99)
