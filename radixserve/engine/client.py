"""What the server and programs call on an engine: one process's (``Engine``) or a
cluster's front door (``ClusterEngine``). Both satisfy ``EngineClient``; the generate calls
they share are written here once and hand each engine a ``GenerateCall``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from radixserve.engine.config import EngineConfig
from radixserve.engine.request_factory import Sampling
from radixserve.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixserve.chat.reasoning_parsers import ReasoningFormat
    from radixserve.chat.templates import ChatFormat
    from radixserve.chat.tool_parsers import ToolFormat
    from radixserve.cpu import CpuProfile


@dataclass(frozen=True)
class GenerateCall:
    """One call's prompts (text, or token ids) and how to sample them. ``rid`` names the
    requests; ``affinity`` (OpenAI's ``prompt_cache_key``) is a hint a cluster's router
    follows to keep requests together (one engine serves them all anyway)."""

    prompt: str | Sequence[str] | None = None
    sampling_params: Sampling | Sequence[Sampling] | None = None
    input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None
    namespace: Hashable | None = None
    rid: str | None = None
    affinity: str | None = None


class EngineClient(Protocol):
    config: EngineConfig
    tokenizer: Any
    vocab_size: int
    context_len: int

    async def async_generate(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: Sampling | Sequence[Sampling] | None = None,
        *,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        namespace: Hashable | None = None,
        rid: str | None = None,
        affinity: str | None = None,
    ) -> dict | list[dict]:
        """Run the prompts to completion: one output (a dict) for a single prompt and
        sample, else a list; cancelling the call aborts its requests."""
        call = GenerateCall(prompt, sampling_params, input_ids, namespace, rid, affinity)
        return await self._async_generate(call)

    def generate_stream(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: Sampling | Sequence[Sampling] | None = None,
        *,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        namespace: Hashable | None = None,
        rid: str | None = None,
        affinity: str | None = None,
    ) -> AsyncIterator[dict]:
        """Chunks ``{"index", "rid", "text": delta, "token_ids": new ids, "finished"}`` of
        every request as they come (``index`` in ``generate``'s output order: prompt by
        prompt, each prompt's ``n`` samples in turn); a request's last chunk also carries
        ``meta_info``. Bad input raises here, before anything streams (a grammar that does
        not compile, at the first chunk: ``check_grammar`` first to know before); closing the
        iterator early aborts what is unfinished."""
        call = GenerateCall(prompt, sampling_params, input_ids, namespace, rid, affinity)
        return self._generate_stream(call)

    async def _async_generate(self, call: GenerateCall) -> dict | list[dict]: ...

    def _generate_stream(self, call: GenerateCall) -> AsyncIterator[dict]: ...

    async def check_grammar(self, sampling_params: SamplingParams) -> None:
        """``ValueError`` with the compiler's reason when the grammar does not compile."""
        ...

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **template_kwargs,
    ) -> list[int]: ...

    @property
    def tool_format(self) -> ToolFormat: ...

    @property
    def reasoning_format(self) -> ReasoningFormat | None: ...

    @property
    def chat_format(self) -> ChatFormat: ...

    @property
    def cpu_profile(self) -> CpuProfile | None:
        """The CPU paths the model runs on (None on a GPU, or where replicas each have
        their own)."""
        ...

    @property
    def weights(self) -> dict:
        """The model's weights as served and as stored (empty where not known)."""
        ...

    def cache_stats(self) -> dict: ...

    def flush_cache(self) -> bool: ...

    def check_invariants(self) -> None: ...

    def shutdown(self) -> None: ...
