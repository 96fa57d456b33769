"""When a request is done, and its text so far.

Text grows by decoding only the newest tokens, with two offsets per request as vLLM keeps
them: ``ids[prefix_offset:read_offset]`` is a short window already turned into text, and
each step decodes that window plus the new tokens and keeps what the new tokens added.
Decoding from a little before the new tokens keeps tokenizers that strip a word's leading
space at the start of a decode (SentencePiece) right; a text ending in a replacement
character waits for the next token to complete it. A step therefore costs O(new tokens),
not a decode of the whole output, for stop strings and streams alike.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixserve.engine.req import Req


@dataclass(eq=False)
class Detokenized:
    """A request's text so far; ``output_ids[prefix_offset:read_offset]`` is the window
    already turned into text."""

    text: str = ""
    prefix_offset: int = 0
    read_offset: int = 0


class StopChecker:
    def __init__(self, tokenizer, eos_token_ids: Collection[int], context_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos = frozenset(eos_token_ids)
        self.context_len = context_len

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def check(self, req: Req) -> None:
        """After new tokens: extend the request's text and finish it if it is done."""
        p, token, detok = req.params, req.output_ids[-1], req.detok
        before = len(detok.text)
        text = detok.text + self._new_text(req)
        stops = len(req.output_ids) >= p.min_new_tokens  # before that, no stop ends it
        reason, matched = None, None
        if stops and (token in p.stop_token_ids or (not p.ignore_eos and token in self.eos)):
            reason, matched = "stop", token
        elif stops and p.stop and (hit := first_stop(text, p.stop, before)) is not None:
            text = text[: hit[0]]
            reason, matched = "stop", hit[1]
        elif len(req.output_ids) >= p.max_new_tokens or req.seq_len >= self.context_len:
            reason = "length"
        detok.text = text
        if reason is not None:
            req.finish(reason, matched)

    def finalize(self, req: Req) -> None:
        """At the end, add what the window still holds back (an unfinished character is
        kept as the replacement character), unless a stop string cut the text."""
        detok, ids = req.detok, req.output_ids
        if isinstance(req.matched_stop, str) or detok.read_offset == len(ids):
            return
        window = self.decode(ids[detok.prefix_offset : detok.read_offset])
        detok.text += self.decode(ids[detok.prefix_offset :])[len(window) :]
        detok.prefix_offset = detok.read_offset = len(ids)

    def _new_text(self, req: Req) -> str:
        detok, ids = req.detok, req.output_ids
        window = self.decode(ids[detok.prefix_offset : detok.read_offset])
        text = self.decode(ids[detok.prefix_offset :])
        if len(text) <= len(window) or text.endswith("\ufffd"):
            return ""
        detok.prefix_offset, detok.read_offset = detok.read_offset, len(ids)
        return text[len(window) :]


def first_stop(text: str, stops: tuple[str, ...], new_from: int = 0) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` that ends after ``new_from`` (the text before it
    was searched already): ``(position, stop)``."""
    hits = []
    for stop in stops:
        at = text.find(stop, max(0, new_from - len(stop) + 1))
        if at >= 0:
            hits.append((at, stop))
    return min(hits) if hits else None
