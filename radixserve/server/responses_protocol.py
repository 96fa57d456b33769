"""The body of ``POST /v1/responses`` (OpenAI's Responses API: text and function tools) and
its input items as chat messages."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from radixserve.engine import SamplingParams
from radixserve.server.protocol import Unsupported, refuse
from radixserve.server.tool_fields import (
    ChatMessage,
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    ToolFields,
)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class InputText(_Body):
    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[InputText]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionOutputItem, Field(union_mode="left_to_right")
]


class FunctionTool(FunctionDef):
    type: Literal["function"]


class NamedFunctionChoice(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat = Field(default_factory=lambda: TextFormat(type="text"))


class ResponsesRequest(_Body):
    model: str | None = None
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = Field(default=None, gt=-(2**63), lt=2**63)
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    text: TextConfig | None = None
    prompt_cache_key: str | None = None
    # fields that would change the answer and are not implemented
    background: bool | None = Unsupported
    conversation: Any = Unsupported
    prompt: Any = Unsupported
    include: list[str] | None = Field(default=None, description="only an empty list")
    reasoning: dict[str, Any] | None = Field(default=None, description="only null effort")
    truncation: Literal["disabled"] | None = Field(default=None, description="only disabled")

    @model_validator(mode="after")
    def _reject_unsupported(self):
        unsupported = [n for n in ("background", "conversation", "prompt") if getattr(self, n)]
        if self.include:
            unsupported.append("include")
        if self.reasoning and any(v is not None for v in self.reasoning.values()):
            unsupported.append("reasoning")
        refuse(unsupported)
        fields = self.tool_fields()  # a choice that names no tool fails here
        if fields.forces_calls and self.grammar():
            raise ValueError("tool_choice that forces a call cannot go with text.format")
        return self

    def tool_fields(self) -> ToolFields:
        """The tools as chat completions take them."""
        tools = None
        if self.tools is not None:
            tools = [
                {"type": "function", "function": t.model_dump(exclude={"type"})} for t in self.tools
            ]
        choice = self.tool_choice
        if isinstance(choice, NamedFunctionChoice):
            choice = NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
        return ToolFields(
            tools=tools, tool_choice=choice, parallel_tool_calls=self.parallel_tool_calls
        )

    def grammar(self) -> dict[str, Any]:
        """The grammar field of ``SamplingParams`` ``text.format`` asks for."""
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return {}
        if fmt.type == "json_object":
            return {"json_object": True}
        if fmt.schema_ is None:
            raise ValueError("text.format of type json_schema needs a schema")
        return {"json_schema": fmt.schema_}

    def sampling(self, **extra: Any) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_output_tokens or 1024,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            **self.grammar(),
            **extra,
        )

    def messages(self) -> list[dict]:
        """The input items as chat messages (``instructions`` not included)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out: list[dict] = []
        for item in self.input:
            if isinstance(item, MessageItem):
                out.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
                if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                    out[-1]["tool_calls"].append(call)  # parallel calls: one turn
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            else:
                output = item.output
                if not isinstance(output, str):
                    output = "".join(part.text for part in output)
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        for m in out:  # the chat checks (a tool turn needs content, ...) hold here too
            ChatMessage.model_validate(m)
        return out


def tools_key(request: ResponsesRequest) -> str:
    """What the prompt's tool section depends on: equal keys render equally."""
    return json.dumps(request.tool_fields().tool_dicts(), sort_keys=True)
