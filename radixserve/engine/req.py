"""A request's life inside the engine: what it asked for, where it stands, what it made.

Its state is grouped by the module that writes it: ``kv`` (its slots and its lock in the
prefix cache) by ``ReqCacheManager``, ``detok`` (its text) by ``StopChecker``, ``logprobs``
by the runner. A request ends in one place, ``finish``.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from radixserve.engine.runner.logprob_store import ReqLogprobs
from radixserve.engine.sampling_params import SamplingParams
from radixserve.engine.scheduler.req_cache import ReqKV
from radixserve.engine.stop import Detokenized

if TYPE_CHECKING:
    from xgrammar import GrammarMatcher

    from radixserve.engine.speculative.drafts import DraftState


class ReqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    rid: str
    input_ids: np.ndarray  # int32
    params: SamplingParams
    namespace: Hashable | None = None
    output_ids: list[int] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    finish_reason: str | None = None
    # the stop token id or stop string that ended it
    matched_stop: int | str | None = None
    kv: ReqKV = field(default_factory=ReqKV)
    detok: Detokenized = field(default_factory=Detokenized)
    logprobs: ReqLogprobs = field(default_factory=ReqLogprobs)
    arrival_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    finish_s: float | None = None
    # structured output: an xgrammar matcher that has accepted exactly output_ids
    grammar: GrammarMatcher | None = None
    # speculative decoding: how this request drafts, None when off
    draft_state: DraftState | None = None

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    def seq(self) -> np.ndarray:
        if not self.output_ids:
            return self.input_ids
        return np.concatenate([self.input_ids, np.asarray(self.output_ids, dtype=np.int32)])

    @property
    def text(self) -> str:
        return self.detok.text

    @property
    def finished(self) -> bool:
        return self.state is ReqState.FINISHED

    def finish(self, reason: str, matched: int | str | None = None) -> None:
        """End the request: ``stop``, ``length``, ``abort`` or ``error: ...``; ``matched``
        is the stop token or string that ended it."""
        self.finish_reason, self.matched_stop = reason, matched
        self.state = ReqState.FINISHED
