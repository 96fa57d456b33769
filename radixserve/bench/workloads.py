"""The seeded workloads the benchmarks send: requests of token ids (``numpy.int32`` arrays,
the form the cache compares fastest), and the serving suite's shapes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixserve.bench.common import check_choices
from radixserve.sim.optimal import optimal_hit_rate


@dataclass(frozen=True)
class Request:
    """One request of a workload: its prompt and how many tokens it asks for. Requests of
    wave ``k`` are sent once wave ``k - 1`` is done (a conversation's next turn, an agent's
    next step, a tree's next level)."""

    prompt: np.ndarray
    max_tokens: int
    wave: int = 0


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    requests: list[Request]

    @property
    def waves(self) -> list[list[Request]]:
        out: dict[int, list[Request]] = {}
        for r in self.requests:
            out.setdefault(r.wave, []).append(r)
        return [out[k] for k in sorted(out)]

    def optimal_hit_rate(self, page_size: int = 1) -> float:
        return optimal_hit_rate(((r.prompt, None) for r in self.requests), page_size)

    def row(self, config: str, seconds: float, cached_tokens: int) -> dict:
        """What every configuration reports of a pass over the workload (each request's
        ``max_tokens`` generated), whatever ran it."""
        n, prompt = len(self.requests), sum(len(r.prompt) for r in self.requests)
        return {
            "workload": self.name,
            "config": config,
            "requests": n,
            "seconds": seconds,
            "req_s": n / seconds,
            "tok_s": (prompt + sum(r.max_tokens for r in self.requests)) / seconds,
            "hit_rate": cached_tokens / prompt,
            "prefill_tokens": prompt - cached_tokens,
        }


class _Tokens:
    def __init__(self, seed: int, vocab_size: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size

    def __call__(self, n: int) -> np.ndarray:
        return self.rng.integers(3, self.vocab_size, n, dtype=np.int32)

    def cat(self, *parts: np.ndarray) -> np.ndarray:
        return np.concatenate(parts).astype(np.int32)


def few_shot(t: _Tokens, s: float, out: int) -> Workload:
    shots = t.cat(*(t(100) for _ in range(5)))
    reqs = [Request(t.cat(shots, t(40)), out) for _ in range(int(20 * s))]
    return Workload("few-shot", "5-shot MMLU-style: 5 shared examples, distinct questions", reqs)


def hellaswag(t: _Tokens, s: float, out: int) -> Workload:
    reqs = []
    for _ in range(int(8 * s)):
        context = t(300)
        reqs += [Request(t.cat(context, t(30)), out) for _ in range(4)]
    return Workload("hellaswag", "one context, four candidate endings each", reqs)


def multi_turn_chat(t: _Tokens, s: float, out: int) -> Workload:
    reqs = []
    for _ in range(int(8 * s)):
        history = t(200)
        for turn in range(4):
            prompt = t.cat(history, t(40))
            reqs.append(Request(prompt, out, wave=turn))
            history = t.cat(prompt, t(40))  # the recorded reply joins the history
    return Workload("multi-turn-chat", "8 chats x 4 turns; each turn extends the last", reqs)


def shared_system_prompt(t: _Tokens, s: float, out: int) -> Workload:
    system = t(600)
    reqs = [Request(t.cat(system, t(30)), out) for _ in range(int(16 * s))]
    return Workload("shared-system-prompt", "one 600-token system prompt, many users", reqs)


def tree_of_thought(t: _Tokens, s: float, out: int) -> Workload:
    levels: list[list[np.ndarray]] = [[], []]
    for _ in range(int(4 * s)):
        frontier = [t(200)]
        for level in levels:
            frontier = [t.cat(node, t(40)) for node in frontier for _ in range(3)]
            level += frontier
    # The questions are independent programs running at once: a level's branches arrive
    # interleaved across questions, not grouped by question.
    reqs = [
        Request(level[i], out, wave=w)
        for w, level in enumerate(levels)
        for i in t.rng.permutation(len(level)).tolist()
    ]
    return Workload("tree-of-thought", "questions branching 3 ways, 2 levels deep", reqs)


def agent_loop(t: _Tokens, s: float, out: int) -> Workload:
    reqs = []
    for _ in range(int(6 * s)):
        trajectory = t(300)
        for step in range(5):
            reqs.append(Request(trajectory, out, wave=step))
            trajectory = t.cat(trajectory, t(60))  # thought, action, observation
    return Workload("agent-loop", "ReAct-style: a trajectory that grows each step", reqs)


def rag(t: _Tokens, s: float, out: int) -> Workload:
    docs = [t(250) for _ in range(6)]
    rng = t.rng
    reqs = []
    for _ in range(int(20 * s)):
        picked = sorted(rng.choice(len(docs), 2, replace=False).tolist())
        reqs.append(Request(t.cat(*(docs[i] for i in picked), t(30)), out))
    return Workload("rag", "2 of 6 shared documents in varying combinations + a question", reqs)


def long_prefix(t: _Tokens, s: float, out: int) -> Workload:
    prefix = t(1024)
    reqs = [Request(t.cat(prefix, t(64)), out) for _ in range(int(32 * s))]
    return Workload("long-prefix", "one 1,024-token prefix, 32 requests at once", reqs)


def no_sharing(t: _Tokens, s: float, out: int) -> Workload:
    reqs = [Request(t(500), out) for _ in range(int(20 * s))]
    return Workload("no-sharing", "control: random prompts, nothing to reuse", reqs)


SERVING_WORKLOADS = {
    w.__name__.replace("_", "-"): w
    for w in (
        few_shot,
        hellaswag,
        multi_turn_chat,
        shared_system_prompt,
        tree_of_thought,
        agent_loop,
        rag,
        long_prefix,
        no_sharing,
    )
}


def make_workload(
    name: str, vocab_size: int, scale: float = 1.0, max_tokens: int = 8, seed: int = 0
) -> Workload:
    """A seeded workload; ``scale`` multiplies its number of requests (or groups)."""
    check_choices("workload", [name], SERVING_WORKLOADS)
    if scale <= 0 or max_tokens < 1:
        raise ValueError("scale must be positive and max_tokens at least 1")
    return SERVING_WORKLOADS[name](_Tokens(seed, vocab_size), scale, max_tokens)
