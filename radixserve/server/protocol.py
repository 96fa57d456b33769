"""Request bodies of the HTTP API, validated by pydantic, and their sampling settings.

Unknown fields are ignored, as OpenAI's own server does, except the OpenAI fields this server
does not implement and that would change what the output means: a request that sets one of
those gets a 400 naming it instead of an answer that silently ignores it.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass

from radixserve.engine import SamplingParams
from radixserve.server.structured import StructuredFields
from radixserve.server.tool_fields import ChatMessage, ToolFields

TokenId = Annotated[int, Field(ge=0)]
Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
# A field this server rejects: documented in the schema so clients see it is not ignored.
Unsupported = Field(default=None, description="not supported: setting it gets a 400")
MAX_SAMPLES = 16  # n per prompt


def refuse(names: list[str]) -> None:
    """The 400 for fields that would change the answer and are not implemented."""
    if names:
        raise ValueError(f"not supported by this server: {', '.join(names)}")


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class NativeSamplingParams(SamplingParams):
    """``SamplingParams`` as ``/generate`` takes them: an unknown key (``max_tokens`` for
    ``max_new_tokens``, say) is an error, not a setting silently left at its default."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _OpenAIBase(StructuredFields):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    stop: Text | list[Text] | None = None
    seed: int | None = Field(default=None, gt=-(2**63), lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    # extensions
    top_k: int = Field(default=-1, ge=-1)
    min_p: float = Field(default=0.0, ge=0, le=1)
    repetition_penalty: float = Field(default=1.0, gt=0)
    cache_salt: str | None = None
    prompt_cache_key: str | None = Field(
        default=None, description="requests with one key go to one replica (--replicas)"
    )
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = Field(
        default=None, description="ids that end the output"
    )
    min_tokens: int = Field(default=0, ge=0, description="no stop ends the output before this")
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        default=None, description="token id (as a string) -> bias added to its logit"
    )
    # OpenAI fields that would change the output and are not implemented (``functions``:
    # the deprecated form of chat's ``tools``)
    functions: list[Any] | None = Unsupported
    function_call: Any = Unsupported
    # vLLM's and SGLang's extensions that would change the output, where not at the default
    include_stop_str_in_output: bool = Field(default=False, description="only false")
    no_stop_trim: bool = Field(default=False, description="only false")
    skip_special_tokens: bool = Field(default=True, description="only true")

    _unsupported: ClassVar[tuple[str, ...]] = ("functions", "function_call")
    _defaults_only: ClassVar[dict[str, bool]] = {
        "include_stop_str_in_output": False,
        "no_stop_trim": False,
        "skip_special_tokens": True,
    }

    @model_validator(mode="after")
    def _reject_unsupported(self):
        unsupported = [name for name in self._unsupported if getattr(self, name) is not None]
        refuse(unsupported + [n for n, v in self._defaults_only.items() if getattr(self, n) != v])
        self.grammar_fields()  # two structured outputs at once fail here
        self.token_bias()
        return self

    def token_bias(self) -> dict[int, float] | None:
        """``logit_bias`` by token id (its keys are the ids' decimal strings)."""
        if not self.logit_bias:
            return None
        bad = [k for k in self.logit_bias if not k.isdigit()]
        if bad:
            raise ValueError(f"logit_bias keys must be token ids, got {bad[0]!r}")
        return {int(k): v for k, v in self.logit_bias.items()}

    def output_limit(self) -> int | None:
        """The most tokens the request asks for (None: the route's default)."""
        return self.max_tokens

    def sampling(self, max_tokens: int, **extra: Any) -> SamplingParams:
        limit = self.output_limit()
        return SamplingParams(
            max_new_tokens=limit if limit is not None else max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            stop=self.stop,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            min_new_tokens=self.min_tokens,
            logit_bias=self.token_bias(),
            **self.grammar_fields(),
            **extra,
        )


class CompletionRequest(_OpenAIBase):
    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    )
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = Field(default=False, description="return the prompt before each completion")
    suffix: str | None = Unsupported
    best_of: int | None = Field(default=None, description="supported only equal to n")
    tools: list[Any] | None = Field(default=None, description="chat's; here a 400")
    tool_choice: Any = Field(default=None, description="chat's; here a 400")

    _unsupported: ClassVar[tuple[str, ...]] = ("functions", "function_call", "tools", "tool_choice")

    @model_validator(mode="after")
    def _reject_unsupported_completion_fields(self):
        if self.suffix is not None:
            raise ValueError("not supported by this server: suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("not supported by this server: best_of other than n")
        return self

    def prompts(self) -> dict[str, list]:
        """The prompt as ``generate`` takes it: ``{"prompt": [...]}`` or
        ``{"input_ids": [...]}``, one entry per prompt."""
        p = self.prompt
        if isinstance(p, str):
            return {"prompt": [p]}
        if isinstance(p[0], str):
            return {"prompt": list(p)}
        if isinstance(p[0], int):
            return {"input_ids": [list(p)]}
        return {"input_ids": [list(x) for x in p]}


class ChatCompletionRequest(ToolFields, _OpenAIBase):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="passed to the chat template (enable_thinking, say)"
    )
    modalities: list[Literal["text"]] | None = Field(
        default=None, description="text only: audio output is not supported"
    )
    audio: Any = Unsupported
    web_search_options: Any = Unsupported

    _unsupported: ClassVar[tuple[str, ...]] = (
        *_OpenAIBase._unsupported,
        "audio",
        "web_search_options",
    )

    @model_validator(mode="after")
    def _one_grammar(self):
        if self.forces_calls and self.grammar_fields():
            raise ValueError("tool_choice that forces a call cannot go with structured output")
        return self

    @model_validator(mode="after")
    def _one_limit(self):
        both = (self.max_tokens, self.max_completion_tokens)
        if None not in both and both[0] != both[1]:
            raise ValueError("max_tokens and max_completion_tokens differ: give one")
        return self

    def output_limit(self) -> int | None:
        """``max_completion_tokens``, OpenAI's newer name, or ``max_tokens``."""
        return self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens


class GenerateRequest(_Body):
    text: Text | Annotated[list[Text], Field(min_length=1)] | None = None
    input_ids: TokenIds | Annotated[list[TokenIds], Field(min_length=1)] | None = None
    sampling_params: NativeSamplingParams = Field(default_factory=NativeSamplingParams)
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = Field(default=-1, ge=-1)
    top_logprobs_num: int = Field(default=0, ge=0)
    cache_salt: str | None = None
    # SGLang's fields that would change the answer and are not implemented
    image_data: Any = Unsupported
    audio_data: Any = Unsupported
    video_data: Any = Unsupported
    lora_path: Any = Unsupported
    return_text_in_logprobs: bool | None = Unsupported

    _unsupported: ClassVar[tuple[str, ...]] = (
        "image_data",
        "audio_data",
        "video_data",
        "lora_path",
        "return_text_in_logprobs",
    )

    @model_validator(mode="after")
    def _one_source(self):
        refuse([n for n in self._unsupported if getattr(self, n) not in (None, False)])
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("pass exactly one of text and input_ids")
        if self.sampling_params.n > MAX_SAMPLES:
            raise ValueError(f"sampling_params.n must be <= {MAX_SAMPLES}")
        defaults = SamplingParams()
        for name in ("return_logprob", "logprob_start_len", "top_logprobs_num"):
            if getattr(self.sampling_params, name) != getattr(defaults, name):
                raise ValueError(f"give {name} beside sampling_params, not inside them")
        return self

    def sampling(self) -> SamplingParams:
        return dataclasses.replace(
            self.sampling_params,
            return_logprob=self.return_logprob,
            logprob_start_len=self.logprob_start_len,
            top_logprobs_num=self.top_logprobs_num,
        )


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[TokenId]
