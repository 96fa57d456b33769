"""The embedded ``Engine``: submit prompts from any thread, the scheduler loop runs on its own.

The loop thread owns the scheduler, the cache and the model; callers talk to it through a
command inbox and get results back through futures (``generate``) or asyncio queues
(``generate_stream``), so no lock is held while the model runs.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future

from radixserve.cache import create_prefix_cache
from radixserve.chat.templates import ChatTemplating
from radixserve.cpu.native import load_native
from radixserve.engine import compute_thread
from radixserve.engine.client import EngineClient, GenerateCall
from radixserve.engine.config import EngineConfig
from radixserve.engine.inbox import Inbox
from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.outputs import Listener, request_output, stream_outputs
from radixserve.engine.reports import EngineReports
from radixserve.engine.req import Req
from radixserve.engine.request_factory import RequestFactory, Sampling
from radixserve.engine.runner.model_runner import ModelRunner
from radixserve.engine.runner.sampler import Sampler
from radixserve.engine.runner.token_picking import new_tokens
from radixserve.engine.sampling_params import SamplingParams
from radixserve.engine.scheduler.req_cache import ReqCacheManager
from radixserve.engine.scheduler.scheduler import Scheduler
from radixserve.engine.speculative.drafts import Drafter
from radixserve.engine.speculative.verify import record_drafted_logprobs
from radixserve.engine.stop import StopChecker
from radixserve.engine.structured.constrained import ConstrainedDecoding
from radixserve.engine.structured.grammar import GrammarCompiler
from radixserve.engine.tiers import create_tiers
from radixserve.engine.trace_recorder import TraceRecorder
from radixserve.memory import KVSlotAllocator
from radixserve.memory.host_malloc import keep_freed_memory

logger = logging.getLogger(__name__)


class Engine(ChatTemplating, EngineReports, EngineClient):
    def __init__(self, model: str = "tiny", **options) -> None:
        self.config = EngineConfig(model=model, **options)
        if self.config.tune_malloc:  # before the threads below allocate (host_malloc.py)
            keep_freed_memory()
        # The model is built on the thread that runs every step (``compute_thread``):
        # torch's OpenMP pools belong to the thread that calls them, and prefills ran
        # slower with the model built on the caller's thread.
        built: Future = Future()
        self._ready = threading.Event()
        self._inbox = Inbox()
        self._thread = threading.Thread(
            target=self._run, args=(built,), name="radixserve-scheduler", daemon=True
        )
        self._thread.start()
        self.runner = built.result()
        try:
            self._setup()
        except BaseException:  # the thread stops instead of waiting for a loop to run
            self._inbox.close()
            raise
        finally:
            self._ready.set()
        # A daemon thread still inside a native op when the interpreter finalizes aborts the
        # process, so a script that never calls shutdown() stops the loop at exit.
        shutdown = weakref.WeakMethod(self.shutdown)  # the exit hook keeps no engine alive
        self._at_exit = lambda: (stop := shutdown()) is not None and stop()
        atexit.register(self._at_exit)

    def _setup(self) -> None:
        config = self.config
        loaded = self.runner.loaded
        self.tokenizer = loaded.tokenizer
        self.vocab_size = loaded.config.vocab_size
        self.context_len = loaded.config.context_len
        self.allocator = KVSlotAllocator(self.runner.num_slots, config.page_size)
        index = config.cache_index if config.enable_prefix_cache else "off"
        self.cache = create_prefix_cache(
            index, config.page_size, self.allocator, config.eviction_policy, load_native()
        )
        self.metrics = EngineMetrics()
        self.stop_checker = StopChecker(self.tokenizer, loaded.eos_token_ids, self.context_len)
        limit = min(self.context_len, self.allocator.capacity - config.page_size)
        self.requests = RequestFactory(self.tokenizer, self.vocab_size, limit - 1)
        rule = None
        if config.cascade_attention:
            rule = self.runner.backend.prefix_group_rule(config.cascade_min_shared)
        self.grammars = GrammarCompiler(
            self.tokenizer, self.vocab_size, loaded.eos_token_ids, config.grammar_compile_timeout_s
        )
        self.constrained = ConstrainedDecoding(
            self.vocab_size, loaded.eos_token_ids, self.context_len, self.metrics
        )
        self.tier = create_tiers(config, loaded.model, self.runner.pool, self.cache)
        write_through = config.write_policy == "write_through"
        req_cache = ReqCacheManager(
            self.cache, self.allocator, self.metrics, self.tier, write_through
        )
        finish_check = self.constrained.finish_check(self.stop_checker)
        drafter = None
        if config.speculative is not None:
            drafter = Drafter(self.cache, config.speculative_tokens, self.context_len, self.metrics)
        jump = self.constrained.jump_forward
        self.scheduler = Scheduler(
            config, req_cache, self.metrics, finish_check, rule, drafter, jump
        )
        self.sampler = Sampler(config.seed, loaded.eos_token_ids)
        self.recorder = None
        if config.record_trace is not None:
            self.recorder = TraceRecorder(config.record_trace, config.page_size)
        self._reqs: dict[str, Req] = {}
        self._listeners: dict[str, Listener] = {}

    # ---- public API ----------------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: Sampling | Sequence[Sampling] | None = None,
        *,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        namespace: object = None,
    ) -> dict | list[dict]:
        """Run one prompt (a dict back) or a list of them (a list back) to completion."""
        reqs, single = self.requests.make(prompt, sampling_params, input_ids, namespace)
        self.grammars.bind(reqs)
        compute_thread.release_caller_team()
        outs = [f.result() for f in [self._submit(r) for r in reqs]]
        return outs[0] if single and len(outs) == 1 else outs

    async def _async_generate(self, call: GenerateCall) -> dict | list[dict]:
        reqs, single = self.requests.make(
            call.prompt, call.sampling_params, call.input_ids, call.namespace, call.rid
        )
        await self.grammars.bind_async(reqs)
        compute_thread.release_caller_team()
        futures = [asyncio.wrap_future(self._submit(r)) for r in reqs]
        try:
            outs = await asyncio.gather(*futures)
        except asyncio.CancelledError:
            for req in reqs:
                self.abort(req.rid)
            raise
        return outs[0] if single and len(outs) == 1 else list(outs)

    def _generate_stream(self, call: GenerateCall) -> AsyncIterator[dict]:
        reqs, _ = self.requests.make(
            call.prompt, call.sampling_params, call.input_ids, call.namespace, call.rid
        )
        compute_thread.release_caller_team()
        prepare = functools.partial(self.grammars.bind_async, reqs)
        return stream_outputs(reqs, self._submit, self.abort, lambda: self._inbox.closed, prepare)

    async def check_grammar(self, sampling_params: SamplingParams) -> None:
        """Compile the grammar of ``sampling_params`` (kept for the requests that use it);
        ``ValueError`` with the compiler's reason when it does not compile."""
        if sampling_params.grammar is not None:
            await self.grammars.result_async(sampling_params)

    def abort(self, rid: str) -> None:
        def command() -> None:
            req = self._reqs.get(rid)
            if req is not None and not req.finished:
                self.scheduler.abort(req)
                self._finish(req)

        self._inbox.post(command)

    def shutdown(self) -> None:
        """Abort what is in flight and stop the scheduler thread; safe to call twice."""
        self._inbox.close()
        self._thread.join()
        self.grammars.close()
        self.constrained.close()
        if self.tier is not None:
            self.tier.close()
        if self.recorder is not None:
            self.recorder.close()
        atexit.unregister(self._at_exit)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- commands ------------------------------------------------------------------------

    def _submit(self, req: Req, listener: Listener | None = None) -> Future:
        future: Future = Future()

        def on_update(r: Req, done: bool) -> None:
            if listener is not None:
                listener(r, done)
            if done and not future.done():
                future.set_result(request_output(r))

        def command() -> None:
            self._reqs[req.rid] = req
            self._listeners[req.rid] = on_update
            self.scheduler.add(req)

        self._inbox.post(command)
        return future

    # ---- the loop ------------------------------------------------------------------------

    def _run(self, built: Future) -> None:
        try:
            built.set_result(compute_thread.call(lambda: ModelRunner(self.config)))
        except BaseException as exc:  # handed to the constructor, which raises it
            built.set_exception(exc)
            return
        self._ready.wait()
        if not self._inbox.closed:
            self._loop()

    def _loop(self) -> None:
        while (commands := self._inbox.take(lambda: self.scheduler.has_work)) is not None:
            try:
                for command in commands:
                    command()
                compute_thread.call(self._step)
            except Exception:  # a bug must not leave callers waiting forever
                logger.exception("scheduler step failed; failing every request in flight")
                self._fail_all("error: internal")
        self._fail_all("abort")

    def _fail_all(self, reason: str) -> None:
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            try:
                self.scheduler.abort(req, reason)
            finally:
                self._finish(req)

    def _step(self) -> None:
        m = self.metrics
        t0 = t_step = time.perf_counter()
        batch = self.scheduler.schedule()
        m.scheduler_s += time.perf_counter() - t0
        if batch is None:
            if self.scheduler.has_work:
                time.sleep(0.001)  # waiting on memory held by nothing: let commands in
            return
        try:
            t_forward = time.perf_counter()
            masks = self.constrained.start(batch.work)
            out = self.runner.forward(batch)
            m.forward_s += time.perf_counter() - t_forward
            new, drafted = new_tokens(batch, out, masks, self.constrained, self.sampler)
        except Exception as exc:  # a failed forward fails its requests, not the engine
            for item in batch.work:
                self.scheduler.abort(item.req, f"error: {exc}")
                self._finish(item.req)
            return
        now = time.perf_counter()
        for req in new:
            if req.first_token_s is None:
                req.first_token_s = now
        t0 = time.perf_counter()
        before = {d.req: len(d.req.output_ids) for d in drafted}
        finished = self.scheduler.process(batch, new)
        for d in drafted:
            record_drafted_logprobs(d, len(d.req.output_ids) - before[d.req])
        m.scheduler_s += time.perf_counter() - t0
        if batch.decode:
            m.decode_s += time.perf_counter() - t_forward
            m.decode_tokens += sum(len(t) for t in new.values())
        m.steps += 1
        self.scheduler.observe(batch, time.perf_counter() - t_step)
        for req in finished:
            self._finish(req)
        done = set(finished)
        for req in new:
            if req not in done:
                self._listeners[req.rid](req, False)
        if self.config.check_invariants:
            self.cache.check_invariants(self.scheduler.slots_held)

    def _finish(self, req: Req) -> None:
        self.stop_checker.finalize(req)
        req.finish_s = time.perf_counter()
        ttft = None if req.first_token_s is None else req.first_token_s - req.arrival_s
        self.metrics.finished(len(req.output_ids), ttft, req.finish_s - req.arrival_s)
        self.sampler.forget(req)
        if self.recorder is not None:
            self.recorder.record(req)
        listener = self._listeners.pop(req.rid, None)
        self._reqs.pop(req.rid, None)
        if listener is not None:
            listener(req, True)
