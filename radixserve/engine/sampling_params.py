"""Per-request sampling settings, validated when built so bad input fails before queueing."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The ways of constraining the output to a grammar; a request takes at most one.
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "choice", "json_object")


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] | str | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # until the output has this many tokens, its stop tokens are never sampled and its stop
    # strings do not end it (vLLM's ``min_tokens``)
    min_new_tokens: int = 0
    seed: int | None = None
    n: int = 1
    # added to the logits of these token ids (each in [-100, 100]) before anything else:
    # logprobs, penalties and sampling all see the biased logits
    logit_bias: Mapping[int, float] | None = None
    return_logprob: bool = False  # log-probabilities of the generated tokens
    top_logprobs_num: int = 0  # with them, the top alternatives at each position
    logprob_start_len: int = -1  # >= 0: also the prompt's tokens from this position on
    # Structured output (``engine/grammar.py``): the output follows a JSON schema (a dict or
    # its JSON text), a regular expression, an EBNF grammar (root rule ``root``), one of
    # the ``choice`` strings, or is any JSON object.
    json_schema: dict[str, Any] | str | None = None
    regex: str | None = None
    ebnf: str | None = None
    choice: tuple[str, ...] | None = None
    json_object: bool = False
    # text the grammar forces is appended without sampling and computed as one extend
    jump_forward: bool = True

    def __post_init__(self) -> None:
        checks = [
            (self.max_new_tokens >= 0, f"max_new_tokens must be >= 0, got {self.max_new_tokens}"),
            (
                0 <= self.min_new_tokens <= self.max_new_tokens,
                f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}",
            ),
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 or >= 1, got {self.top_k}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (self.n >= 1, f"n must be >= 1, got {self.n}"),
            (self.seed is None or abs(self.seed) < 2**63, "seed must fit in 64 bits"),
            (self.top_logprobs_num >= 0, "top_logprobs_num must be >= 0"),
            (self.logprob_start_len >= -1, "logprob_start_len must be >= -1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError("stop must be non-empty strings")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        self._check_logit_bias()
        self._check_grammar()

    def _check_logit_bias(self) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, Mapping):
            raise ValueError("logit_bias must map token ids to biases")
        bias = {}
        for token, value in self.logit_bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids, got {token!r}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"logit_bias values must be numbers, got {value!r}")
            if not -100 <= value <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {value}")
            bias[token] = float(value)
        object.__setattr__(self, "logit_bias", bias or None)

    def _check_grammar(self) -> None:
        given = [name for name in GRAMMAR_FIELDS if getattr(self, name) not in (None, False)]
        if len(given) > 1:
            raise ValueError(f"give at most one of {', '.join(given)}")
        if given and self.min_new_tokens:  # a grammar's end is the output's end
            raise ValueError(f"min_new_tokens cannot go with {given[0]}")
        if isinstance(self.json_schema, dict):
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        elif isinstance(self.json_schema, str):
            try:
                json.loads(self.json_schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"json_schema is not valid JSON: {exc}") from None
        elif self.json_schema is not None:
            raise ValueError("json_schema must be a dict or its JSON text")
        for name in ("regex", "ebnf"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string")
        if self.choice is not None:
            choice = (self.choice,) if isinstance(self.choice, str) else tuple(self.choice)
            if not choice or any(not isinstance(c, str) or not c for c in choice):
                raise ValueError("choice must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", choice)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        """Whether top-k, top-p or min-p drops any token (each is a no-op at its default)."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0

    @property
    def grammar(self) -> tuple[str, str] | None:
        """``(kind, source)`` of the grammar the output must follow, or None."""
        for name in GRAMMAR_FIELDS:
            value = getattr(self, name)
            if name == "choice" and value is not None:
                return name, json.dumps(value)
            if name == "json_object" and value:
                return name, ""
            if isinstance(value, str):
                return name, value
        return None

    @property
    def prompt_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0
