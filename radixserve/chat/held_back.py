"""What a stream holds back: the end of a text that may still turn into a stop string, a
tool-call opening or a reasoning tag, sent once the next tokens settle it."""

from __future__ import annotations


def stable_text(text: str, stops: tuple[str, ...]) -> str:
    """The part of a running request's ``text`` that later tokens cannot change: without a
    tail that could begin a stop string (if the stop string completes, it is cut)."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return text[: len(text) - hold]


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that ``tag`` starts with: what a stream
    holds back until it knows whether ``tag`` follows."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
