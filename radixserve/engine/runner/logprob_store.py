"""A request's logprobs as the runner records them, read by the chunks and outputs built
from it (torch-free, so the request and the scheduler need no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

# (logprob, token id)
Logprob = tuple[float, int]


@dataclass(eq=False)
class ReqLogprobs:
    # one per generated token, and its top alternatives (when asked), in output order
    output: list[Logprob] = field(default_factory=list)
    output_top: list[list[Logprob]] = field(default_factory=list)
    # the prompt's, keyed by position (recorded chunk by chunk as prefill goes)
    prompt: dict[int, float] = field(default_factory=dict)
    prompt_top: dict[int, list[Logprob]] = field(default_factory=dict)
