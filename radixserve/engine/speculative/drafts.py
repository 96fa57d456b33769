"""Draft tokens for speculative decoding, without a draft model.

A decoding request proposes the tokens that followed its context in a cached sequence of its
own namespace (the tree keeps every finished prompt and answer: the same question asked
again, an agent re-emitting a call), else those that followed the latest earlier occurrence
of its last few tokens in its own prompt and output (an n-gram match: code that copies the
input, an answer quoting its document), cut where a grammar rejects it. The model verifies
drafts in the next step (``speculative.py``); only verified tokens ever reach the tree.

How many it proposes adapts to what it got accepted: twice as many after a fully accepted
draft (copied text runs on: a run regains its length in a few steps), one past the accepted
ones otherwise; after a second draft in a row of which nothing was accepted it pauses 1
step, then 3, 7, 15, so text with nothing to draft runs as plain decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from radixserve.cache import BasePrefixCache
from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.req import Req

NGRAM_MAX = 4  # the longest context suffix an n-gram draft matches
NGRAM_MIN = 2
MAX_PAUSE = 15


@dataclass
class DraftState:
    """One request's drafting: how many it may propose, and its run of rejected drafts."""

    limit: int
    misses: int = 0
    pause: int = 0
    source: str = ""  # where the pending draft came from


def ngram_draft(seq: np.ndarray, limit: int) -> np.ndarray:
    """The ``limit`` tokens after the latest earlier occurrence of ``seq``'s longest suffix
    of ``NGRAM_MAX`` down to ``NGRAM_MIN`` tokens; empty when none recurs."""
    for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
        if len(seq) <= n:
            continue
        windows = sliding_window_view(seq[:-1], n)
        found = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if len(found):
            start = int(found[-1]) + n
            return seq[start : start + limit]
    return seq[:0]


def drafts_allowed(req: Req) -> bool:
    """Drafts keep a request's output distribution where its next token depends only on the
    logits and the grammar: not under a penalty over what it has generated."""
    p = req.params
    return p.repetition_penalty == 1 and not p.frequency_penalty and not p.presence_penalty


def draft_prefix(req: Req, draft: tuple[int, ...]) -> tuple[int, ...]:
    """The longest start of ``draft`` that ``req``'s grammar (if any) accepts after its
    output, up to a token after which the grammar forces text to jump over; the matcher is
    left where it was."""
    matcher = req.grammar
    if matcher is None or not draft:
        return draft
    jumps = req.params.jump_forward and not req.params.return_logprob
    kept = 0
    while kept < len(draft) and not matcher.is_terminated():
        if not matcher.accept_token(draft[kept]):
            break
        kept += 1
        if jumps and matcher.find_jump_forward_string():
            break
    if kept:
        matcher.rollback(kept)
    return draft[:kept]


class Drafter:
    def __init__(
        self,
        cache: BasePrefixCache,
        max_tokens: int,
        context_len: int,
        metrics: EngineMetrics,
    ) -> None:
        self.cache = cache
        self.max_tokens = max_tokens
        self.context_len = context_len
        self.metrics = metrics

    def propose(self, req: Req) -> tuple[int, ...]:
        """Up to the request's limit of draft tokens for its next step (none: plain decode)."""
        state = req.draft_state
        if state is None:
            state = req.draft_state = DraftState(self.max_tokens)
        if state.pause:
            state.pause -= 1
            return ()
        room = min(
            state.limit,
            req.params.max_new_tokens - len(req.output_ids) - 1,
            self.context_len - req.seq_len - 1,
        )
        if room <= 0 or not drafts_allowed(req):
            return ()
        seq = req.seq()
        draft, state.source = self.cache.continuation(seq, req.namespace, room), "tree"
        if not len(draft):
            draft, state.source = ngram_draft(seq, room), "ngram"
        return draft_prefix(req, tuple(draft.tolist()))

    def observe(self, req: Req, proposed: int, accepted: int) -> None:
        """What verification kept of the request's draft: its next limit, and the counts."""
        state = req.draft_state
        m = self.metrics
        m.draft_tokens[state.source] = m.draft_tokens.get(state.source, 0) + proposed
        m.accepted_tokens[state.source] = m.accepted_tokens.get(state.source, 0) + accepted
        m.verify_steps += 1
        if accepted == proposed:
            state.limit = min(self.max_tokens, 2 * state.limit)
        else:
            state.limit = max(1, accepted + 1)
        state.misses = 0 if accepted else state.misses + 1
        state.pause = min(MAX_PAUSE, 2 ** max(0, state.misses - 1) - 1)
