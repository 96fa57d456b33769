"""Constrained decoding, step by step: token bitmasks on the logits of the rows that sample,
the matcher advanced on each new token, and jump-forward over text the grammar forces.

The bitmasks of a step depend only on tokens already accepted, so they are filled on a
worker thread while the step's forward pass runs. Jump-forward hands the tokens the grammar
forces to the scheduler, which appends them to the request's output without sampling them
and runs them as one extend chunk in the next step, instead of one decode step each. The
tokens are xgrammar's (``find_jump_forward_tokens``), each accepted by the matcher in turn,
so the model is fed exactly what the grammar accepts.

A speculative draft is cut at its first token the grammar rejects (``drafts.draft_prefix``);
its verification masks the distribution at each draft position with the bitmask of the
matcher advanced over the draft tokens before it (then rolled back), so a kept draft token
is one the grammar allows there and the tokens are those constrained plain decoding picks.
Where plain decoding would append forced tokens after a kept draft token, the draft is cut
there too: what follows was verified without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch

from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.req import Req
from radixserve.engine.runner.model_runner import Drafted
from radixserve.engine.scheduler.batch import Work
from radixserve.engine.stop import StopChecker
from radixserve.engine.structured.grammar import xgrammar_module


class Filled(NamedTuple):
    """A step's bitmasks: ``bitmask`` rows ``rows`` of its sampled logits, and per drafted
    request one row per draft position."""

    bitmask: torch.Tensor | None
    rows: list[int]
    drafts: dict[Req, torch.Tensor]
    seconds: float


class ConstrainedDecoding:
    def __init__(
        self, vocab_size: int, stop_token_ids, context_len: int, metrics: EngineMetrics
    ) -> None:
        self.vocab_size = vocab_size
        self.context_len = context_len
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.metrics = metrics
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="radixserve-bitmask")
        self._batch = None  # xgrammar's batch matcher, built on first use
        self._probe = None  # one row, to look at what a completed grammar still allows
        words = (vocab_size + 31) // 32
        self._not_stop = np.full(words, 0xFFFFFFFF, dtype=np.uint32)  # clears the stop bits
        for token in self.stop_token_ids:
            self._not_stop[token // 32] &= ~np.uint32(1 << (token % 32))

    # ---- one step ------------------------------------------------------------------------

    def start(self, work: list[Work]) -> Future | None:
        """Begin filling the bitmasks of a step's constrained rows that sample (in the order
        of its logits) and of each position of its constrained drafts; None when nothing is
        constrained."""
        sampling = [w.req for w in work if w.samples and not w.draft]
        rows = [i for i, r in enumerate(sampling) if r.grammar is not None]
        drafts = {w.req: w.draft for w in work if w.draft and w.req.grammar is not None}
        if not rows and not drafts:
            return None
        matchers = [sampling[i].grammar for i in rows]
        return self._pool.submit(self._fill, matchers, len(sampling), rows, drafts)

    def apply(self, logits: torch.Tensor, pending: Future | None) -> torch.Tensor:
        """``logits`` ([rows, vocab]) as float32 with every token the grammars forbid at
        minus infinity."""
        if pending is None:
            return logits
        t0 = time.perf_counter()
        filled: Filled = pending.result()
        self.metrics.grammar_fill_s += filled.seconds
        if filled.rows:
            logits = self._mask(logits, filled.bitmask, filled.rows)
        self.metrics.grammar_wait_s += time.perf_counter() - t0
        return logits

    def apply_drafted(self, drafted: list[Drafted], pending: Future | None) -> list[Drafted]:
        """``drafted`` with each constrained request's logits masked position by position."""
        if pending is None:
            return drafted
        masks = pending.result().drafts
        return [
            replace(d, logits=self._mask(d.logits, masks[d.req], None)) if d.req in masks else d
            for d in drafted
        ]

    def _mask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows) -> torch.Tensor:
        logits = logits.float().contiguous()
        bitmask = bitmask.to(logits.device, non_blocking=True)
        xgrammar_module().apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=self.vocab_size, indices=rows
        )
        return logits

    def _fill(self, matchers: list, batch: int, rows: list[int], drafts: dict) -> Filled:
        t0 = time.perf_counter()
        xgr = xgrammar_module()
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher(max_threads=1)
        bitmask = None
        if rows:
            bitmask = xgr.allocate_token_bitmask(batch, self.vocab_size)
            self._batch.batch_fill_next_token_bitmask(matchers, bitmask, rows)
        masks = {req: self._fill_draft(req.grammar, draft) for req, draft in drafts.items()}
        return Filled(bitmask, rows, masks, time.perf_counter() - t0)

    def _fill_draft(self, matcher, draft: tuple[int, ...]) -> torch.Tensor:
        """The bitmask after each prefix of ``draft`` (all of it accepted: see
        ``draft_prefix``), the matcher left where it was."""
        bitmask = xgrammar_module().allocate_token_bitmask(len(draft) + 1, self.vocab_size)
        for j, token in enumerate(draft):
            matcher.fill_next_token_bitmask(bitmask, j)
            if not matcher.accept_token(token):
                matcher.rollback(j)
                raise RuntimeError(f"the grammar rejected draft token {token}")
        matcher.fill_next_token_bitmask(bitmask, len(draft))
        matcher.rollback(len(draft))
        return bitmask

    # ---- after a token -------------------------------------------------------------------

    def jump_forward(self, req: Req) -> list[int]:
        """Accept ``req``'s newest token and return the tokens the grammar forces after it,
        each accepted in turn (none without a grammar, or when the request asked for
        logprobs); a token the grammar rejects finishes the request with an error."""
        matcher = req.grammar
        if matcher is None:
            return []
        if not matcher.accept_token(req.output_ids[-1]):
            req.finish(f"error: the grammar rejected token {req.output_ids[-1]}")
            return []
        p = req.params
        room = min(p.max_new_tokens - len(req.output_ids), self.context_len - req.seq_len)
        forced: list[int] = []
        if p.jump_forward and not p.return_logprob and room > 0:
            for token in matcher.find_jump_forward_tokens()[:room]:
                if not matcher.accept_token(token):
                    break
                forced.append(token)
            self.metrics.jump_forward_tokens += len(forced)
        return forced

    def done(self, req: Req) -> bool:
        """Whether the grammar has ended: it took its stop token, or what has been accepted
        is complete and nothing but a stop token may follow."""
        matcher = req.grammar
        if matcher.is_terminated():
            return True
        if not matcher.is_completed():
            return False
        if self._probe is None:
            self._probe = xgrammar_module().allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(self._probe)
        allowed = self._probe[0].numpy().view(np.uint32)
        return not (allowed & self._not_stop).any()

    def finish_check(self, stop: StopChecker) -> Callable[[Req], None]:
        """What the scheduler runs after a request's new tokens: the usual checks, and a
        grammar that has ended finishes its request."""

        def check(req: Req) -> None:
            stop.check(req)
            if req.grammar is not None and not req.finished and self.done(req):
                req.finish("stop")

        return check

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
