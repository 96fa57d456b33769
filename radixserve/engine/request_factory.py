"""What a caller passes (text or token ids, one prompt or many, sampling params) turned into
requests, with the checks that make bad input fail before anything is queued."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from radixserve.engine.req import Req
from radixserve.engine.sampling_params import SamplingParams

# sampling params as callers may pass them: the dataclass or a dict of its fields
Sampling = SamplingParams | Mapping[str, Any]
NOT_SAMPLING = "sampling_params must be SamplingParams, a dict of its fields or a list of either"


class RequestFactory:
    def __init__(self, tokenizer, vocab_size: int, max_prompt_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_prompt_tokens = max_prompt_tokens
        self._ids = itertools.count()

    def make(
        self,
        prompt: str | Sequence[str] | None,
        sampling_params: Sampling | Sequence[Sampling] | None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None,
        namespace: object,
        rid: str | None = None,
    ) -> tuple[list[Req], bool]:
        """The requests, prompt by prompt and each prompt's ``n`` samples in turn, and
        whether a single prompt was passed (one output, not a list, goes back)."""
        prompts, single = self.prompts(prompt, sampling_params, input_ids)
        reqs = []
        for arr, p in prompts:
            for _ in range(p.n):
                # each sample of a seeded request draws from its own seed
                seeded = p if p.seed is None or p.n == 1 else replace(p, seed=p.seed + len(reqs))
                reqs.append(Req(f"req-{next(self._ids)}", arr, seeded, namespace))
        if rid is not None:
            if len(reqs) != 1:
                raise ValueError("an explicit rid names exactly one request")
            reqs[0].rid = rid
        return reqs, single

    def prompts(
        self,
        prompt: str | Sequence[str] | None,
        sampling_params: Sampling | Sequence[Sampling] | None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None,
    ) -> tuple[list[tuple[np.ndarray, SamplingParams]], bool]:
        """Each prompt's checked token ids with its sampling params, and whether a single
        prompt was passed."""
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt and input_ids")
        if prompt is not None:
            single = isinstance(prompt, str)
            prompts = [prompt] if single else list(prompt)
            if any(not isinstance(p, str) for p in prompts):
                raise ValueError("prompt must be a string or a list of strings")
            ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        else:
            single = len(input_ids) == 0 or not isinstance(input_ids[0], Sequence | np.ndarray)
            ids = [list(input_ids)] if single else [list(x) for x in input_ids]
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(params, SamplingParams | Mapping):
            params = [params] * len(ids)
        if not isinstance(params, Sequence):
            raise ValueError(NOT_SAMPLING)
        params = [_sampling(p) for p in params]
        if len(params) != len(ids):
            raise ValueError(f"got {len(params)} sampling params for {len(ids)} prompts")
        return [(self._check_prompt(t, p), p) for t, p in zip(ids, params, strict=True)], single

    def _check_prompt(self, tokens, params: SamplingParams) -> np.ndarray:
        """The prompt as the scheduler takes it, or a ValueError that says what is wrong."""
        if not isinstance(params, SamplingParams):
            raise ValueError(NOT_SAMPLING)
        arr = np.asarray(tokens)
        if arr.size == 0:
            raise ValueError("the prompt is empty")
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ValueError("input_ids must be a list of ints")
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        if params.logit_bias and max(params.logit_bias) >= self.vocab_size:
            raise ValueError(f"logit_bias token ids must lie in [0, {self.vocab_size})")
        if arr.size > self.max_prompt_tokens:
            raise ValueError(
                f"the prompt has {arr.size} tokens; this engine serves at most "
                f"{self.max_prompt_tokens}"
            )
        return arr.astype(np.int32)


def _sampling(params: Sampling) -> SamplingParams:
    """``SamplingParams``, or a dict of its fields (as SGLang's engine takes them)."""
    if not isinstance(params, Mapping):
        return params
    unknown = sorted(set(params) - {f.name for f in dataclasses.fields(SamplingParams)})
    if unknown:
        raise ValueError(f"unknown sampling params: {', '.join(unknown)}")
    return SamplingParams(**params)
