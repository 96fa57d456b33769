"""A request's life inside the engine: what it asked for, where it stands, what it made.

Its slots and its lock in the prefix cache are kept by ``ReqCacheManager`` (region map
there); the text by ``StopChecker``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from radixserve.engine.sampling_params import SamplingParams


class ReqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    rid: str
    input_ids: np.ndarray  # int32
    params: SamplingParams
    namespace: object = None
    output_ids: list[int] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    slots: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    cached_len: int = 0
    computed_len: int = 0
    last_node: object = None
    prompt_cached_tokens: int = 0  # prefix hit at first admission (preemption excluded)
    prompt_cached_by_tier: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None
    matched_stop: object = None
    text: str = ""
    # output_ids[prefix_offset:read_offset] is already text: the incremental detokenizer's
    # window (see StopChecker)
    prefix_offset: int = 0
    read_offset: int = 0
    arrival_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    finish_s: float | None = None
    admitted_once: bool = False
    # (logprob, token id) per generated token; prompt ones keyed by position
    output_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: dict[int, float] = field(default_factory=dict)
    input_top_logprobs: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    # a read of its pages from the disk tier (ReqCacheManager.ready), or "done"
    tier_read: object = None
    # structured output: an xgrammar matcher that has accepted exactly output_ids
    grammar: object = None
    # (src, dst) slots: the head of a cached page this request copies into its own first
    # page instead of computing it, done by its next pass (ReqCacheManager.admit)
    kv_copy: tuple[np.ndarray, np.ndarray] | None = None
    # speculative decoding: how this request drafts (``drafts.DraftState``), None when off
    draft_state: object = None

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    def seq(self) -> np.ndarray:
        if not self.output_ids:
            return self.input_ids
        return np.concatenate([self.input_ids, np.asarray(self.output_ids, dtype=np.int32)])

    @property
    def finished(self) -> bool:
        return self.state is ReqState.FINISHED

    @property
    def own_slots(self) -> np.ndarray:
        """The slots this request allocated itself (whole pages)."""
        return self.slots[self.cached_len :]
