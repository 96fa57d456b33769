"""Per-request sampling settings, validated when built so bad input fails before queueing."""

from __future__ import annotations

from dataclasses import dataclass


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
    seed: int | None = None
    n: int = 1
    return_logprob: bool = False  # log-probabilities of the generated tokens
    top_logprobs_num: int = 0  # with them, the top alternatives at each position
    logprob_start_len: int = -1  # >= 0: also the prompt's tokens from this position on

    def __post_init__(self) -> None:
        checks = [
            (self.max_new_tokens >= 0, f"max_new_tokens must be >= 0, got {self.max_new_tokens}"),
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def prompt_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0
