"""The embedded ``Engine``: submit prompts from any thread, the scheduler loop runs on its own.

The loop thread owns the scheduler, the cache and the model; callers talk to it through a
command inbox and get results back through futures (``generate``) or asyncio queues
(``generate_stream``), so no lock is held while the model runs.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace

import numpy as np

from radixserve.cache import BlockHashCache, NoPrefixCache, RadixCache
from radixserve.engine.config import EngineConfig
from radixserve.engine.logprobs import record_logprobs
from radixserve.engine.model_runner import ModelRunner
from radixserve.engine.req import Req, ReqState
from radixserve.engine.sampler import Sampler
from radixserve.engine.sampling_params import SamplingParams
from radixserve.engine.scheduler import Scheduler
from radixserve.memory import KVSlotAllocator

Listener = Callable[[Req, bool], None]
logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, model: str = "tiny", **options) -> None:
        self.config = EngineConfig(model=model, **options)
        self.runner = ModelRunner(self.config)
        loaded = self.runner.loaded
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.vocab_size = loaded.config.vocab_size
        self.context_len = loaded.config.context_len
        page = self.config.page_size
        self.allocator = KVSlotAllocator(self.runner.num_slots, page)
        index = {"radix": RadixCache, "block-hash": BlockHashCache}[self.config.cache_index]
        cache_cls = index if self.config.enable_prefix_cache else NoPrefixCache
        self.cache = cache_cls(page, self.allocator)
        self.scheduler = Scheduler(self.config, self.cache, self.allocator, self._check_finish)
        if self.config.cascade_attention and self.runner.backend.uses_prefix_groups:
            self.scheduler.cascade_min_len = self.config.cascade_min_shared
        self.sampler = Sampler(self.config.seed)
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._inbox: list[Callable[[], None]] = []
        self._reqs: dict[str, Req] = {}
        self._listeners: dict[str, Listener] = {}
        self._stopping = False
        self._started = time.perf_counter()
        self._finished = self._generated = 0
        self._steps, self._sched_s = 0, 0.0  # forward steps; time in schedule + process
        self._decode_s, self._decode_tokens = 0.0, 0  # decode batches: forward + sampling
        self._ttft: deque[float] = deque(maxlen=10_000)
        self._latency: deque[float] = deque(maxlen=10_000)
        self._thread = threading.Thread(target=self._loop, name="radixserve-scheduler", daemon=True)
        self._thread.start()
        # A daemon thread still inside a native op when the interpreter finalizes aborts the
        # process, so a script that never calls shutdown() stops the loop at exit.
        self._at_exit = _shutdown_at_exit(weakref.ref(self))
        atexit.register(self._at_exit)

    # ---- public API ----------------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        namespace: object = None,
    ) -> dict | list[dict]:
        """Run one prompt (a dict back) or a list of them (a list back) to completion."""
        reqs, single = self._make_requests(prompt, sampling_params, input_ids, namespace)
        futures = [self._submit(r) for r in reqs]
        outs = [f.result() for f in futures]
        return _group(outs, single)

    async def async_generate(
        self,
        prompt=None,
        sampling_params=None,
        *,
        input_ids=None,
        namespace: object = None,
        rid: str | None = None,
    ) -> dict | list:
        """``generate`` for asyncio callers; cancelling it aborts its requests."""
        reqs, single = self._make_requests(prompt, sampling_params, input_ids, namespace, rid)
        futures = [asyncio.wrap_future(self._submit(r)) for r in reqs]
        try:
            outs = await asyncio.gather(*futures)
        except asyncio.CancelledError:
            for req in reqs:
                self.abort(req.rid)
            raise
        return _group(list(outs), single)

    async def generate_stream(
        self,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        *,
        input_ids: Sequence[int] | None = None,
        namespace: object = None,
        rid: str | None = None,
    ) -> AsyncIterator[dict]:
        """Yield ``{"text": delta, "token_ids": new ids, "finished": bool, ...}`` chunks;
        the last chunk also carries ``meta_info``. Closing the iterator early aborts."""
        reqs, _ = self._make_requests(prompt, sampling_params, input_ids, namespace, rid)
        if len(reqs) != 1:
            raise ValueError("generate_stream takes one prompt with n=1")
        req = reqs[0]
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def listener(r: Req, done: bool) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, done)

        self._submit(req, listener)
        try:
            async for chunk in self._stream_chunks(req, queue):
                yield chunk
        finally:
            if not req.finished and not self._stopping:
                self.abort(req.rid)

    async def _stream_chunks(self, req: Req, queue: asyncio.Queue) -> AsyncIterator[dict]:
        sent = {"tokens": 0, "text": ""}
        while True:
            done = await queue.get()
            # req.text is current once done or when it has stop strings (_check_finish);
            # otherwise a stream decodes here, off the scheduler thread
            live = done or req.params.stop
            text = req.text if live else self._decode(req.output_ids[:])
            if not done:
                text = _stable_text(text, req.params.stop)
            chunk = {
                "rid": req.rid,
                "text": text[len(sent["text"]) :],
                "token_ids": req.output_ids[sent["tokens"] :],
                "finished": done,
            }
            sent["tokens"] = len(req.output_ids)
            sent["text"] = text
            if done:
                chunk["meta_info"] = self._output(req)["meta_info"]
            if chunk["token_ids"] or done:
                yield chunk
            if done:
                return

    def abort(self, rid: str) -> None:
        def command() -> None:
            req = self._reqs.get(rid)
            if req is not None and not req.finished:
                self.scheduler.abort(req)
                self._finish(req)

        self._post(command)

    def flush_cache(self) -> bool:
        """Drop everything cached; refused (False) while requests are running."""

        def flush() -> bool:
            if self.scheduler.has_work:
                return False
            self.cache.reset()
            return True

        return self._on_loop(flush)

    def cache_stats(self) -> dict:
        """Prefix-cache and serving metrics, read on the scheduler thread."""
        return self._on_loop(self._stats)

    def _stats(self) -> dict:
        s = self.scheduler
        elapsed = time.perf_counter() - self._started
        ttft, latency = np.array(self._ttft or [0.0]), np.array(self._latency or [0.0])
        return {
            "queried_tokens": s.queried_tokens,
            "hit_tokens": s.hit_tokens,
            "token_hit_rate": s.hit_tokens / s.queried_tokens if s.queried_tokens else 0.0,
            "request_hit_rate": s.requests_hit / s.requests_admitted
            if s.requests_admitted
            else 0.0,
            "cached_tokens": self.cache.total_size,
            "evictable_tokens": self.cache.evictable_size,
            "protected_tokens": self.cache.protected_size,
            "kv_capacity": self.allocator.capacity,
            "kv_used": self.allocator.num_used,
            "kv_usage": self.allocator.num_used / self.allocator.capacity,
            "memory_dedup_ratio": s.dedup_ratio,
            "running": len(s.running),
            "waiting": len(s.waiting),
            "preemptions": s.num_preemptions,
            "scheduler_steps": self._steps,
            "cascade_groups": s.cascade_groups,
            "cascade_saved_tokens": s.cascade_saved_tokens,
            "scheduler_s": self._sched_s,
            "decode_s": self._decode_s,
            "decode_tokens": self._decode_tokens,
            "finished_requests": self._finished,
            "generated_tokens": self._generated,
            "generation_throughput": self._generated / elapsed,
            "ttft_p50_s": float(np.percentile(ttft, 50)),
            "ttft_p99_s": float(np.percentile(ttft, 99)),
            "latency_p50_s": float(np.percentile(latency, 50)),
            "latency_p99_s": float(np.percentile(latency, 99)),
        }

    def _on_loop(self, fn: Callable[[], object]):
        """Run ``fn`` on the scheduler thread between steps and return its result."""
        done: Future = Future()

        def command() -> None:
            try:
                done.set_result(fn())
            except Exception as exc:  # handed to the caller
                done.set_exception(exc)

        self._post(command)
        return done.result()

    def check_invariants(self) -> None:
        """Audit the cache and slot accounting (from any thread; waits for the loop)."""
        self._on_loop(lambda: self.cache.check_invariants(self.scheduler.slots_held))

    def shutdown(self) -> None:
        """Abort what is in flight and stop the scheduler thread; safe to call twice."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        atexit.unregister(self._at_exit)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- requests ------------------------------------------------------------------------

    def _make_requests(self, prompt, sampling_params, input_ids, namespace, rid=None):
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt and input_ids")
        if prompt is not None:
            single = isinstance(prompt, str)
            prompts = [prompt] if single else list(prompt)
            if any(not isinstance(p, str) for p in prompts):
                raise ValueError("prompt must be a string or a list of strings")
            ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        else:
            single = len(input_ids) == 0 or not isinstance(input_ids[0], Sequence | np.ndarray)
            ids = [list(input_ids)] if single else [list(x) for x in input_ids]
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(ids)
        if len(params) != len(ids):
            raise ValueError(f"got {len(params)} sampling params for {len(ids)} prompts")
        reqs = []
        for tokens, p in zip(ids, params, strict=True):
            arr = self._check_prompt(tokens, p)
            for _ in range(p.n):
                seeded = p if p.seed is None or p.n == 1 else replace(p, seed=p.seed + len(reqs))
                reqs.append(Req(f"req-{next(self._ids)}", arr, seeded, namespace))
        if rid is not None:
            if len(reqs) != 1:
                raise ValueError("an explicit rid names exactly one request")
            reqs[0].rid = rid
        return reqs, single

    def _check_prompt(self, tokens, params: SamplingParams) -> np.ndarray:
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be SamplingParams")
        arr = np.asarray(tokens)
        if arr.size == 0:
            raise ValueError("the prompt is empty")
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ValueError("input_ids must be a list of ints")
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        limit = min(self.context_len, self.allocator.capacity - self.config.page_size)
        if arr.size >= limit:
            raise ValueError(
                f"the prompt has {arr.size} tokens; this engine serves at most {limit - 1}"
            )
        return arr.astype(np.int32)

    def _submit(self, req: Req, listener: Listener | None = None) -> Future:
        future: Future = Future()

        def on_update(r: Req, done: bool) -> None:
            if listener is not None:
                listener(r, done)
            if done and not future.done():
                future.set_result(self._output(r))

        def command() -> None:
            self._reqs[req.rid] = req
            self._listeners[req.rid] = on_update
            self.scheduler.add(req)

        self._post(command)
        return future

    def _post(self, command: Callable[[], None]) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine is shut down")
            self._inbox.append(command)
            self._cond.notify()

    # ---- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self.scheduler.has_work and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    break
                commands, self._inbox = self._inbox, []
            try:
                for command in commands:
                    command()
                self._step()
            except Exception:  # a bug must not leave callers waiting forever
                logger.exception("scheduler step failed; failing every request in flight")
                self._fail_all("error: internal")
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.abort(req)
            self._finish(req)

    def _fail_all(self, reason: str) -> None:
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            req.finish_reason = reason
            try:
                self.scheduler.abort(req)
            finally:
                self._finish(req)

    def _step(self) -> None:
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        self._sched_s += time.perf_counter() - t0
        if batch is None:
            if self.scheduler.has_work:
                time.sleep(0.001)  # waiting on memory held by nothing: let commands in
            return
        try:
            t_forward = time.perf_counter()
            out = self.runner.forward(batch)
            sampled = out.sampled
            tokens = self.sampler.sample(out.last, sampled)
            record_logprobs(batch, out, tokens)
            if batch.decode:
                self._decode_s += time.perf_counter() - t_forward
                self._decode_tokens += len(batch.work)
        except Exception as exc:  # a failed forward fails its requests, not the engine
            for item in batch.work:
                item.req.finish_reason = f"error: {exc}"
                self.scheduler.abort(item.req)
                self._finish(item.req)
            return
        now = time.perf_counter()
        for req in sampled:
            if req.first_token_s is None:
                req.first_token_s = now
        t0 = time.perf_counter()
        finished = self.scheduler.process(batch, dict(zip(sampled, tokens, strict=True)))
        self._sched_s += time.perf_counter() - t0
        self._steps += 1
        for req in finished:
            self._finish(req)
        done = set(finished)
        for req in sampled:
            if req not in done:
                self._listeners[req.rid](req, False)
        if self.config.check_invariants:
            self.cache.check_invariants(self.scheduler.slots_held)

    def _check_finish(self, req: Req) -> None:
        p, token = req.params, req.output_ids[-1]
        if p.stop:  # stop strings are looked for in the text, so it is decoded every token
            req.text = self._decode(req.output_ids)
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            req.finish_reason, req.matched_stop = "stop", token
        elif p.stop and (hit := _first_stop(req.text, p.stop)) is not None:
            req.text = req.text[: hit[0]]
            req.finish_reason, req.matched_stop = "stop", hit[1]
        elif len(req.output_ids) >= p.max_new_tokens or req.seq_len >= self.context_len:
            req.finish_reason = "length"
        if req.finish_reason is not None:
            req.state = ReqState.FINISHED

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _finish(self, req: Req) -> None:
        if not req.params.stop:
            # Decoded once here rather than every token: decoding n tokens costs O(n), so
            # every token would make a long generation quadratic on the scheduler thread.
            req.text = self._decode(req.output_ids)
        req.finish_s = time.perf_counter()
        self._finished += 1
        self._generated += len(req.output_ids)
        if req.first_token_s is not None:
            self._ttft.append(req.first_token_s - req.arrival_s)
            self._latency.append(req.finish_s - req.arrival_s)
        self.sampler.forget(req)
        listener = self._listeners.pop(req.rid, None)
        self._reqs.pop(req.rid, None)
        if listener is not None:
            listener(req, True)

    def _output(self, req: Req) -> dict:
        end = req.finish_s or time.perf_counter()
        meta = {
            "prompt_tokens": len(req.input_ids),
            "cached_tokens": req.prompt_cached_tokens,
            "completion_tokens": len(req.output_ids),
            "finish_reason": {"type": req.finish_reason, "matched": req.matched_stop},
            "ttft_s": (req.first_token_s or end) - req.arrival_s,
            "latency_s": end - req.arrival_s,
        }
        p = req.params
        if p.return_logprob:
            meta["output_token_logprobs"] = list(req.output_logprobs)
            if p.top_logprobs_num:
                meta["output_top_logprobs"] = list(req.output_top_logprobs)
        if p.prompt_logprobs:
            ids = req.input_ids.tolist()
            meta["input_token_logprobs"] = [
                (req.input_logprobs.get(i), ids[i]) for i in range(p.logprob_start_len, len(ids))
            ]
        return {
            "rid": req.rid,
            "text": req.text,
            "token_ids": list(req.output_ids),
            "meta_info": meta,
        }


def _shutdown_at_exit(ref: weakref.ref[Engine]) -> Callable[[], None]:
    def stop() -> None:
        engine = ref()
        if engine is not None:
            engine.shutdown()

    return stop


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits) if hits else None


def _stable_text(text: str, stops: tuple[str, ...]) -> str:
    """The part of ``text`` that later tokens cannot change: without a trailing replacement
    character (the next token may complete it) and without a tail that could begin a stop
    string (if it completes, it is cut)."""
    text = text.rstrip("\ufffd")
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return text[: len(text) - hold]


def _group(outs: list[dict], single: bool) -> dict | list:
    return outs[0] if single and len(outs) == 1 else outs
