"""Reasoning in a model's text: the part between ``<think>`` and ``</think>``, which chat
APIs return as ``reasoning_content`` beside the answer. Two conventions: Qwen 3's (the model
opens its thinking with ``<think>``; an answer without it has none) and DeepSeek-R1's (the
template opens the thinking in the prompt, so the output starts inside it).

Like the tool-call parsers, one ``ReasoningStream`` serves whole and streamed outputs, so
both split the same text the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixserve.chat.held_back import partial_suffix

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    starts_inside: bool  # the output opens in the thinking (its <think> is in the prompt)

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self.starts_inside)

    def split(self, text: str) -> tuple[str | None, str]:
        """The reasoning (None: none) and the answer of a whole output."""
        stream = self.stream()
        reasoning, content = stream.feed(text)
        more, rest = stream.finish()
        return (reasoning + more) or None, content + rest


class ReasoningStream:
    """Output text in; reasoning and answer text out, piece by piece."""

    def __init__(self, starts_inside: bool) -> None:
        self.starts_inside = starts_inside
        self.state = "start"  # start -> open -> after -> answer, or start -> answer
        self.buffer = ""

    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning and the answer text ``text`` settles."""
        self.buffer += text
        reasoning = ""
        if self.state == "start":
            head = self.buffer.lstrip()
            if OPEN.startswith(head):  # maybe the opening tag, not yet whole
                return "", ""
            if head.startswith(OPEN):
                self.buffer, self.state = head[len(OPEN) :], "open"
            else:
                self.state = "open" if self.starts_inside else "answer"
        if self.state == "open":
            end = self.buffer.find(CLOSE)
            if end < 0:
                keep = partial_suffix(self.buffer, CLOSE)
                reasoning = self.buffer[: len(self.buffer) - keep]
                self.buffer = self.buffer[len(self.buffer) - keep :]
                return reasoning, ""
            reasoning = self.buffer[:end]
            self.buffer, self.state = self.buffer[end + len(CLOSE) :], "after"
        if self.state == "after":  # the line breaks after a thought are layout
            self.buffer = self.buffer.lstrip("\n")
            self.state = "answer" if self.buffer else "after"
        if self.state == "answer" and self.buffer:
            answer, self.buffer = self.buffer, ""
            return reasoning, answer
        return reasoning, ""

    def finish(self) -> tuple[str, str]:
        """What is left once the output has ended: an unclosed thought stays reasoning."""
        rest, self.buffer = self.buffer, ""
        inside = self.state == "open" or (self.state == "start" and self.starts_inside)
        return (rest, "") if inside else ("", rest)


REASONING_FORMATS = {
    f.name: f for f in (ReasoningFormat("qwen3", False), ReasoningFormat("deepseek_r1", True))
}


def reasoning_format(name: str | None) -> ReasoningFormat | None:
    if name is None:
        return None
    if name not in REASONING_FORMATS:
        raise ValueError(
            f"unknown reasoning parser {name!r}; choose from {list(REASONING_FORMATS)}"
        )
    return REASONING_FORMATS[name]
