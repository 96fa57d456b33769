"""Tool calls in a model's text, in the formats models are trained to write them: Hermes's
(Qwen's, and the default) ``<tool_call>`` blocks and Llama 3's bare JSON object.

A format says how a chat template without a tool section is told about the tools, how a
call already made is written back into the history (as the model wrote it, so the next
turn's prompt extends the cached one), how output text becomes calls, and which grammar
forces valid ones. Parsing runs through one ``ToolStream`` whether the text comes whole or
in pieces, so a streamed answer reassembles to exactly the non-streamed one.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass

from radixserve.chat.held_back import partial_suffix
from radixserve.chat.json_grammar import json_schema_ebnf


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # the arguments object's JSON text

    @classmethod
    def from_json(cls, text: str, key: str) -> ToolCall | None:
        """The call a JSON object ``{"name": ..., key: {...}}`` names, None if it is not one."""
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get(key, obj.get("arguments", {}))
        return cls(obj["name"], args if isinstance(args, str) else json.dumps(args))


def tool_spec(tool: dict) -> dict:
    """A tool's ``function`` object (OpenAI's ``{"type": "function", "function": {...}}``)."""
    return tool.get("function", tool)


class ToolStream(ABC):
    """Output text in, plain content and completed calls out, piece by piece."""

    def __init__(self, max_calls: int | None) -> None:
        self.max_calls = max_calls
        self.calls = 0

    @abstractmethod
    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """Content that can no longer be part of a call, and calls completed by ``text``."""

    @abstractmethod
    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left once the output has ended."""

    def _take(self, call: ToolCall | None) -> list[ToolCall]:
        if call is None or (self.max_calls is not None and self.calls >= self.max_calls):
            return []
        self.calls += 1
        return [call]


class ToolFormat(ABC):
    name: str
    key: str  # the arguments' key in a call's JSON

    tools_tags: tuple[str, str]  # around the tools' list
    how_to_call: str  # what a call looks like

    def instructions(self, tools: list[dict]) -> str:
        """The system text that describes ``tools`` to a template without a tool section."""
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return (
            "You can call functions to answer. Their signatures, one JSON object a line:\n"
            f"{self.tools_tags[0]}{listed}{self.tools_tags[1]}\n{self.how_to_call}"
        )

    @abstractmethod
    def write(self, calls: list[ToolCall]) -> str:
        """Calls as the model writes them."""

    @abstractmethod
    def stream(self, max_calls: int | None = None) -> ToolStream:
        """A parser of one output (``max_calls``: the calls kept, None: all)."""

    @abstractmethod
    def wrap(self, call_rule: str, max_calls: int) -> str:
        """The grammar's root rule: 1 to ``max_calls`` calls (``call_rule``: one's JSON)."""

    def response(self, content: str) -> str:
        """A tool's result as the user turn that hands it back."""
        return content

    def parse(self, text: str, max_calls: int | None = None) -> tuple[str | None, list[ToolCall]]:
        """The content (None: none but white space) and the calls of a whole output."""
        stream = self.stream(max_calls)
        content, calls = stream.feed(text)
        rest, more = stream.finish()
        content += rest
        return (content if content.strip() else None), calls + more

    def grammar(self, tools: list[dict], max_calls: int = 1) -> str:
        """EBNF that admits only 1 to ``max_calls`` calls of ``tools`` whose arguments
        match their schemas."""
        cases = []
        for tool in tools:
            spec = tool_spec(tool)
            params = spec.get("parameters") or {"type": "object"}
            cases.append(
                {
                    "type": "object",
                    "properties": {"name": {"const": spec["name"]}, self.key: params},
                    "required": ["name", self.key],
                    "additionalProperties": False,
                }
            )
        try:
            ebnf = json_schema_ebnf(json.dumps({"anyOf": cases}))
        except ValueError as exc:
            raise ValueError(f"tools: {exc}") from None
        lines = [
            "tool_call_json" + line[len("root") :] if line.startswith("root ::=") else line
            for line in ebnf.splitlines()
        ]
        return "\n".join([*lines, self.wrap("tool_call_json", max_calls)])


class _HermesStream(ToolStream):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, max_calls: int | None) -> None:
        super().__init__(max_calls)
        self.buffer, self.inside, self.blank = "", False, ""

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.buffer += text
        content, calls = "", []
        while True:
            if self.inside:
                end = self.buffer.find(self.CLOSE)
                if end < 0:
                    break
                body = self.buffer[:end]
                call = ToolCall.from_json(body.strip(), "arguments")
                if call is None:  # not a call after all: the text stays content
                    content += self._content(self.OPEN + body + self.CLOSE)
                calls += self._take(call)
                self.buffer, self.inside = self.buffer[end + len(self.CLOSE) :], False
                continue
            start = self.buffer.find(self.OPEN)
            if start >= 0:
                content += self._content(self.buffer[:start])
                self.buffer, self.inside = self.buffer[start + len(self.OPEN) :], True
                continue
            keep = partial_suffix(self.buffer, self.OPEN)
            content += self._content(self.buffer[: len(self.buffer) - keep])
            self.buffer = self.buffer[len(self.buffer) - keep :]
            break
        return content, calls

    def _content(self, text: str) -> str:
        """Trailing white space is held back until text follows it: between and after
        calls it is layout, not content."""
        self.blank += text
        body = self.blank.rstrip()
        self.blank = self.blank[len(body) :]
        return body

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self.inside:  # an unclosed last call (the output ended on it)
            body = self.buffer[: len(self.buffer) - partial_suffix(self.buffer, self.CLOSE)]
            call = ToolCall.from_json(body.strip(), "arguments")
            if call is not None:
                self.buffer = ""
                return "", self._take(call)
            return self._content(self.OPEN + self.buffer), []
        return self._content(self.buffer), []


class HermesFormat(ToolFormat):
    name, key = "hermes", "arguments"

    tools_tags = ("<tools>\n", "\n</tools>")
    how_to_call = (
        "To call one, answer with a JSON object of its name and arguments between tags,"
        " one block per call:\n"
        '<tool_call>\n{"name": "function name", "arguments": {"argument": "value"}}\n'
        "</tool_call>"
    )

    def write(self, calls: list[ToolCall]) -> str:
        return "\n".join(
            f'<tool_call>\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}\n'
            "</tool_call>"
            for c in calls
        )

    def response(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def stream(self, max_calls: int | None = None) -> ToolStream:
        return _HermesStream(max_calls)

    def wrap(self, call_rule: str, max_calls: int) -> str:
        one = f'"<tool_call>\\n" {call_rule} "\\n</tool_call>"'
        return f"root ::= {one}" + _more(f'"\\n" {one}', max_calls)


class _JsonStream(ToolStream):
    """Llama 3's calls are the whole answer: an output that opens with ``{`` (or the
    python tag) is held until it ends, then it is calls or, if it does not parse, content."""

    TAG = "<|python_tag|>"

    def __init__(self, max_calls: int | None) -> None:
        super().__init__(max_calls)
        self.buffer, self.held = "", None

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.buffer += text
        if self.held is None:
            head = self.buffer.lstrip()
            if not head or self.TAG.startswith(head):
                return "", []
            self.held = head.startswith(("{", self.TAG))
        if self.held:
            return "", []
        out, self.buffer = self.buffer, ""
        return out, []

    def finish(self) -> tuple[str, list[ToolCall]]:
        text, self.buffer = self.buffer, ""
        calls = _json_objects(text.strip().removeprefix(self.TAG))
        if self.held and calls and all(c is not None for c in calls):
            return "", [c for call in calls for c in self._take(call)]
        return text, []


class Llama3JsonFormat(ToolFormat):
    name, key = "llama3_json", "parameters"

    tools_tags = ("", "")
    how_to_call = (
        "To call one, answer with only a JSON object of its name and parameters:\n"
        '{"name": "function name", "parameters": {"argument": "value"}}'
    )

    def write(self, calls: list[ToolCall]) -> str:
        return "; ".join(
            f'{{"name": {json.dumps(c.name)}, "parameters": {c.arguments}}}' for c in calls
        )

    def stream(self, max_calls: int | None = None) -> ToolStream:
        return _JsonStream(max_calls)

    def wrap(self, call_rule: str, max_calls: int) -> str:
        return f"root ::= {call_rule}" + _more(f'"; " {call_rule}', max_calls)


TOOL_FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HermesFormat(), Llama3JsonFormat())}
TOOL_PARSERS = ("auto", *TOOL_FORMATS)


def tool_format(name: str, chat_template: str | None) -> ToolFormat:
    """The format ``name`` names; ``auto``: the one the chat template writes (Hermes's
    where it shows no other)."""
    if name != "auto":
        if name not in TOOL_FORMATS:
            raise ValueError(f"unknown tool-call parser {name!r}; choose from {TOOL_PARSERS}")
        return TOOL_FORMATS[name]
    template = chat_template or ""
    if "<tool_call>" not in template and ("<|python_tag|>" in template or "ipython" in template):
        return TOOL_FORMATS["llama3_json"]
    return TOOL_FORMATS["hermes"]


def _json_objects(text: str) -> list[ToolCall | None]:
    """The calls of JSON objects separated by ``;`` (None for one that is no call; [None]
    if the text is not such a list)."""
    decoder, at, calls = json.JSONDecoder(), 0, []
    while at < len(text):
        try:
            obj, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return [None]
        calls.append(ToolCall.from_json(json.dumps(obj), "parameters"))
        at = end
        while at < len(text) and text[at] in "; \n\t":
            at += 1
    return calls


def _more(item: str, max_calls: int) -> str:
    """Up to ``max_calls - 1`` more of ``item`` in EBNF."""
    return f" ({item}){{0, {max_calls - 1}}}" if max_calls > 1 else ""
