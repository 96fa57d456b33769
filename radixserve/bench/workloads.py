"""Seeded, offline token-id workloads whose requests share prefixes the way real traffic does.

Token ids are ``numpy.int32`` arrays, the form the cache compares fastest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Request:
    """One request: its prompt, and the tokens the model answers with."""

    prompt: np.ndarray
    output: np.ndarray
    conversation: int
    turn: int

    @property
    def sequence(self) -> np.ndarray:
        """Prompt followed by output: what a finished request leaves in the cache."""
        return np.concatenate([self.prompt, self.output])


@dataclass(frozen=True)
class MultiTurnChat:
    """Users chatting under a few long system prompts.

    Each conversation starts from one of ``num_system_prompts`` prompts; turn ``t``'s prompt is
    the system prompt plus every earlier user message and answer plus the new user message.
    Conversations interleave in a seeded random order, turn by turn.
    """

    num_system_prompts: int = 4
    system_prompt_len: int = 1024
    num_conversations: int = 64
    turns: int = 4
    user_len: int = 48
    output_len: int = 64
    vocab_size: int = 32000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_system_prompts", "num_conversations", "turns", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("system_prompt_len", "user_len", "output_len"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def requests(self) -> Iterator[Request]:
        rng = np.random.default_rng(self.seed)
        systems = [
            self._tokens(rng, self.system_prompt_len) for _ in range(self.num_system_prompts)
        ]
        history = [systems[c % self.num_system_prompts] for c in range(self.num_conversations)]
        for turn in range(self.turns):
            for conv in rng.permutation(self.num_conversations).tolist():
                prompt = np.concatenate([history[conv], self._tokens(rng, self.user_len)])
                req = Request(prompt, self._tokens(rng, self.output_len), conv, turn)
                history[conv] = req.sequence
                yield req

    @property
    def num_requests(self) -> int:
        return self.num_conversations * self.turns

    def _tokens(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(0, self.vocab_size, n, dtype=np.int32)
