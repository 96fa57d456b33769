"""How a chat's output text becomes the assistant's message: the reasoning split off
(``--reasoning-parser``), then tool calls parsed from the answer (when the request has
tools), whole or as stream deltas, through the same parsers either way."""

from __future__ import annotations

from typing import Any

from radixserve.chat.reasoning_parsers import ReasoningFormat
from radixserve.server.openai_format import chat_finish_reason
from radixserve.server.tool_fields import ToolPlan, tool_call_dicts


class ChatOutput:
    def __init__(self, reasoning: ReasoningFormat | None, tools: ToolPlan | None) -> None:
        self.reasoning, self.tools = reasoning, tools

    def message(self, text: str) -> tuple[dict, bool]:
        """The assistant message for a whole output, and whether it calls tools."""
        thought, answer = self.reasoning.split(text) if self.reasoning else (None, text)
        message: dict[str, Any] = {"role": "assistant", "content": answer}
        called = False
        if self.tools is not None:
            message, called = self.tools.message(answer)
        if thought is not None:
            message["reasoning_content"] = thought
        return message, called

    def deltas(self) -> ChatDeltas:
        return ChatDeltas(self)


class ChatDeltas:
    """One chat choice's stream of deltas."""

    def __init__(self, output: ChatOutput) -> None:
        self.thinking = output.reasoning.stream() if output.reasoning else None
        self.calls = output.tools.stream() if output.tools else None
        self.called = 0

    def step(self, chunk: dict) -> dict:
        """The delta this chunk brings: content, reasoning, completed tool calls (each
        whole: id, name and all its arguments at once)."""
        thought, answer = "", chunk["text"]
        if self.thinking is not None:
            thought, answer = self.thinking.feed(answer)
            if chunk["finished"]:
                more, rest = self.thinking.finish()
                thought, answer = thought + more, answer + rest
        calls = []
        if self.calls is not None:
            answer, calls = self.calls.feed(answer)
            if chunk["finished"]:
                rest, more = self.calls.finish()
                answer, calls = answer + rest, calls + more
        delta: dict[str, Any] = {"content": answer} if answer or not (thought or calls) else {}
        if thought:
            delta["reasoning_content"] = thought
        if calls:
            delta["tool_calls"] = tool_call_dicts(calls, self.called)
            self.called += len(calls)
        return delta

    def reason(self, chunk: dict) -> str | None:
        if not chunk["finished"]:
            return None
        return chat_finish_reason(chunk["meta_info"], self.called > 0)
