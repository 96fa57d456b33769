"""Structured output through xgrammar: grammars compiled off the scheduler thread and kept by
their text, and one matcher per constrained request.

A request's matcher has accepted exactly its ``output_ids`` (sampled and jumped-forward
tokens alike), so it knows before a step which tokens may come next; ``StepMasks`` turns that
into bitmasks on the logits of the rows that sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from radixserve.chat.json_grammar import compiler_message, json_schema_ebnf, xgrammar_module
from radixserve.engine.req import Req
from radixserve.engine.sampling_params import SamplingParams

COMPILE_THREADS = 2
CACHE_GRAMMARS = 256


def choice_ebnf(choices: Sequence[str]) -> str:
    """An EBNF grammar matching exactly one of ``choices`` (JSON escapes are EBNF escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCompiler:
    """Compiles each distinct grammar once, on a small pool, and keeps the most recent
    ``CACHE_GRAMMARS`` (failures too: the same bad grammar fails again at once)."""

    def __init__(
        self, tokenizer, vocab_size: int, stop_token_ids: Sequence[int], timeout_s: float
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.timeout_s = timeout_s
        self._compiler = None  # built on first use: importing xgrammar costs a second
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="radixserve-grammar")
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()

    def compile(self, params: SamplingParams) -> Future:
        """The compiled grammar of ``params`` (which must have one), as a future."""
        xgrammar_module()  # missing: a ValueError now, not a compile failure later
        key = params.grammar
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            future = self._pool.submit(self._compile, *key)
            self._cache[key] = future
            if len(self._cache) > CACHE_GRAMMARS:
                self._cache.popitem(last=False)
            return future

    def result(self, params: SamplingParams):
        """The compiled grammar of ``params``, waiting for it here; ``ValueError`` saying
        why there is none (it does not compile, or not within the timeout)."""
        return self._outcome(params, self.compile(params), self.timeout_s)

    async def result_async(self, params: SamplingParams):
        """``result`` for asyncio callers: the event loop goes on while the grammar compiles."""
        future = self.compile(params)
        # shielded: a timeout here must not cancel a compile other requests share
        waiting = asyncio.shield(asyncio.wrap_future(future))
        with contextlib.suppress(Exception):  # _outcome says what went wrong
            await asyncio.wait_for(waiting, self.timeout_s)
        return self._outcome(params, future, 0)

    def bind(self, reqs: Sequence[Req]) -> None:
        """Give each constrained request its matcher (``ValueError`` as ``result``)."""
        for req in reqs:
            if req.params.grammar is not None:
                req.grammar = self._matcher(self.result(req.params))

    async def bind_async(self, reqs: Sequence[Req]) -> None:
        for req in reqs:
            if req.params.grammar is not None:
                req.grammar = self._matcher(await self.result_async(req.params))

    def _outcome(self, params: SamplingParams, future: Future, timeout_s: float):
        kind = params.grammar[0]
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            raise ValueError(f"{kind} did not compile within {self.timeout_s:g} s") from None
        except Exception as exc:  # the compiler's own message names what is wrong
            raise ValueError(f"{kind} does not compile: {compiler_message(exc)}") from None

    def _matcher(self, compiled):
        return xgrammar_module().GrammarMatcher(compiled)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, kind: str, source: str):
        xgr = xgrammar_module()
        with self._lock:  # pool threads build the compiler once
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=COMPILE_THREADS, cache_enabled=False
                )
            compiler = self._compiler
        if kind in ("json_schema", "json_object"):
            schema = source if kind == "json_schema" else '{"type": "object"}'
            return compiler.compile_grammar(json_schema_ebnf(schema))
        if kind == "regex":
            return compiler.compile_regex(source)
        if kind == "choice":
            return compiler.compile_grammar(choice_ebnf(json.loads(source)))
        return compiler.compile_grammar(source)
