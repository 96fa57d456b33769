"""What a program needs from a model: tokenize, generate from token ids, score choices.

Programs send token ids, never text, so every call extends exactly the ids of the earlier
context and the prefix cache sees the same tokens each time."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from radixserve.chat.tool_parsers import ToolFormat
from radixserve.engine import ChatFormat, Engine, SamplingParams

OnText = Callable[[str], None]


class BaseBackend(ABC):
    @property
    @abstractmethod
    def chat_format(self) -> ChatFormat: ...

    @property
    @abstractmethod
    def tool_format(self) -> ToolFormat:
        """How the model writes tool calls."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Ids of ``text`` on its own, special-token markers included, no BOS added."""

    @abstractmethod
    def generate(
        self, input_ids: Sequence[int], params: SamplingParams, on_text: OnText | None = None
    ) -> dict:
        """One completion as the engine returns it (``text``, ``token_ids``, ``meta_info``);
        with ``on_text`` the text arrives piece by piece as it is generated."""

    @abstractmethod
    def score(self, context_ids: Sequence[int], choices: Sequence[Sequence[int]]) -> list[dict]:
        """One output per choice, all in one batch, each with ``input_token_logprobs`` for
        the choice's tokens given the context."""

    def cache_prefix(self, input_ids: Sequence[int]) -> dict:
        """Compute and cache ``input_ids`` without generating: before a fork, so every branch
        finds the shared context cached instead of racing to compute it."""
        return self.generate(input_ids, SamplingParams(max_new_tokens=0))


class StreamCollector:
    """Adds up streamed chunks, passing each piece of text on; returns the whole output
    (as ``generate`` would) once the last chunk arrives."""

    def __init__(self, on_text: OnText) -> None:
        self.on_text, self.ids, self.text = on_text, [], ""

    def __call__(self, chunk: dict) -> dict | None:
        self.ids += chunk["token_ids"]
        self.text += chunk["text"]
        if chunk["text"]:
            self.on_text(chunk["text"])
        if not chunk["finished"]:
            return None
        return {"text": self.text, "token_ids": self.ids, "meta_info": chunk["meta_info"]}


def scoring_params(context_len: int) -> SamplingParams:
    """Prompt log-probabilities from the first choice token on; one throwaway new token."""
    return SamplingParams(
        max_new_tokens=1, temperature=0, return_logprob=True, logprob_start_len=context_len
    )


class EngineBackend(BaseBackend):
    """The in-process ``Engine``; calls block the program's own thread, not the engine's."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def chat_format(self) -> ChatFormat:
        return self.engine.chat_format

    @property
    def tool_format(self) -> ToolFormat:
        return self.engine.tool_format

    def tokenize(self, text: str) -> list[int]:
        return self.engine.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(
        self, input_ids: Sequence[int], params: SamplingParams, on_text: OnText | None = None
    ) -> dict:
        if on_text is None:
            return self.engine.generate(input_ids=list(input_ids), sampling_params=params)
        return asyncio.run(self._stream(list(input_ids), params, on_text))

    async def _stream(self, input_ids: list[int], params: SamplingParams, on_text: OnText):
        collect = StreamCollector(on_text)
        async for chunk in self.engine.generate_stream(input_ids=input_ids, sampling_params=params):
            if (out := collect(chunk)) is not None:
                return out
        raise RuntimeError("the engine's stream ended without a final chunk")

    def score(self, context_ids: Sequence[int], choices: Sequence[Sequence[int]]) -> list[dict]:
        prompts = [[*context_ids, *c] for c in choices]
        params = scoring_params(len(context_ids))
        return self.engine.generate(input_ids=prompts, sampling_params=params)


def as_backend(backend: BaseBackend | Engine) -> BaseBackend:
    if isinstance(backend, BaseBackend):
        return backend
    if isinstance(backend, Engine):
        return EngineBackend(backend)
    raise TypeError(f"backend must be an Engine or a RuntimeEndpoint, got {type(backend)!r}")
