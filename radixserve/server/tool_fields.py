"""The chat request's tool fields (OpenAI's ``tools``, ``tool_choice``,
``parallel_tool_calls``, and messages that carry calls and their results) and what they make
of an answer: the grammar that forces calls, and the output parsed into OpenAI
``tool_calls``, whole or streamed (one parser either way, so both agree)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixserve.chat.tool_parsers import ToolCall, ToolFormat, ToolStream


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(default=None, description="arguments always follow the schema")


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class CalledFunction(_Body):
    name: str
    arguments: str


class MessageToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        """A part this server cannot read (an image, audio, a file) is named in the 400."""
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind is not None and kind != "text":
                raise ValueError(f"content parts of type {kind!r} are not supported: text only")
        return content

    @model_validator(mode="after")
    def _content_given(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def for_template(self) -> dict:
        """The message as chat templates take it: content as one text."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        for name in ("tool_call_id", "name"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


class ToolFields(BaseModel):
    """Mixed into the chat request body."""

    model_config = ConfigDict(extra="ignore")

    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _choice_names_a_tool(self):
        choice = self.tool_choice
        if choice in ("required", None, "none", "auto"):
            if choice == "required" and not self.tools:
                raise ValueError("tool_choice 'required' needs tools")
            return self
        if choice.function.name not in {t.function.name for t in self.tools or []}:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not in tools")
        return self

    @property
    def forces_calls(self) -> bool:
        return self.tools is not None and self.tool_choice not in (None, "none", "auto")

    def tool_dicts(self) -> list[dict] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def plan(self, fmt: ToolFormat, max_calls: int | None = None) -> ToolPlan | None:
        """How the answer is parsed (None: it is plain content: no tools, or ``none``);
        ``max_calls``: a bound on the calls besides ``parallel_tool_calls``."""
        if not self.tools or self.tool_choice == "none":
            return None
        tools = self.tool_dicts()
        if isinstance(self.tool_choice, NamedToolChoice):
            named = self.tool_choice.function.name
            allowed = [t for t in tools if t["function"]["name"] == named]
            return ToolPlan(fmt, allowed, forced=True, max_calls=1)
        if not self.parallel_tool_calls:
            max_calls = 1
        return ToolPlan(fmt, tools, forced=self.tool_choice == "required", max_calls=max_calls)


@dataclass(frozen=True)
class ToolPlan:
    fmt: ToolFormat
    tools: list[dict]  # those a call may name
    forced: bool  # the output is calls only, by grammar
    max_calls: int | None  # None: any number

    def grammar(self) -> str | None:
        """EBNF that admits only valid calls (at most one a tool when parallel: a small
        model would otherwise repeat a call until max_tokens)."""
        if not self.forced:
            return None
        return self.fmt.grammar(self.tools, self.max_calls or len(self.tools))

    def stream(self) -> ToolStream:
        return self.fmt.stream(self.max_calls)

    def message(self, text: str) -> tuple[dict, bool]:
        """The assistant message for an output, and whether it calls tools."""
        content, calls = self.fmt.parse(text, self.max_calls)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = tool_call_dicts(calls)
        return message, bool(calls)


def tool_call_dicts(calls: list[ToolCall], first_index: int | None = None) -> list[dict]:
    """OpenAI's ``tool_calls`` entries, with fresh ids (and, streamed, their indexes)."""
    out = []
    for k, call in enumerate(calls):
        entry: dict[str, Any] = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        if first_index is not None:
            entry = {"index": first_index + k, **entry}
        out.append(entry)
    return out
