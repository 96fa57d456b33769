"""The front door's engine: what the server's routes call on an ``Engine``, over the
``engine`` deployment's replicas. It tokenizes and checks requests here, once, and sends
token ids; each prompt of a batch is its own call, so each is routed by its own prefix.

A replica that dies under a call: a call that had not finished is sent once more (to
another replica: Serve drops the dead one); a stream that had not produced anything yet is
started once more; one that had ends with an error event. Nothing is lost silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import ray
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import ReplicaUnavailableError

from radixserve.chat.templates import ChatTemplating
from radixserve.engine.client import EngineClient, GenerateCall
from radixserve.engine.config import EngineConfig
from radixserve.engine.request_factory import RequestFactory
from radixserve.engine.sampling_params import SamplingParams
from radixserve.server.errors import ApiError

logger = logging.getLogger("radixserve.cluster")
LOST = (RayActorError, ActorUnavailableError, ReplicaUnavailableError)
BROADCAST_TIMEOUT_S = 30.0
MEANS = ("kv_usage", "memory_dedup_ratio", "request_hit_rate")
QUANTILES = ("_p50_s", "_p99_s", "_p50_us", "_p99_us")  # the worst replica's


class ClusterEngine(ChatTemplating, EngineClient):
    def __init__(
        self, handle, config: EngineConfig, tokenizer, vocab_size: int, context_len: int, directory
    ) -> None:
        self.handle = handle
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.context_len = context_len
        self.requests = RequestFactory(tokenizer, vocab_size, context_len - 1)
        self.directory = directory

    # ---- generation ----------------------------------------------------------------------

    async def _async_generate(self, call: GenerateCall) -> dict | list[dict]:
        prompts, single = self.requests.prompts(call.prompt, call.sampling_params, call.input_ids)
        payloads = [_payload(ids, p, call.namespace, call.affinity) for ids, p in prompts]
        calls = [self._call("generate", payload) for payload in payloads]
        outs = [o for out in await asyncio.gather(*calls) for o in _as_list(out)]
        return outs[0] if single and len(outs) == 1 else outs

    def _generate_stream(self, call: GenerateCall) -> AsyncIterator[dict]:
        prompts, _ = self.requests.prompts(call.prompt, call.sampling_params, call.input_ids)
        offsets = [sum(p.n for _, p in prompts[:i]) for i in range(len(prompts))]
        streams = [
            self._stream(_payload(ids, p, call.namespace, call.affinity), offset)
            for (ids, p), offset in zip(prompts, offsets, strict=True)
        ]
        return streams[0] if len(streams) == 1 else _merge(streams)

    async def check_grammar(self, sampling_params: SamplingParams) -> None:
        if sampling_params.grammar is not None:
            await self._call("check_grammar", {"sampling_params": sampling_params})

    async def _call(self, method: str, payload: dict):
        for attempt in (1, 2):
            try:
                return await getattr(self.handle, method).remote(payload)
            except LOST as exc:
                if attempt == 2:
                    raise ApiError(
                        503, f"two replicas failed under the request: {exc}", "server_error"
                    ) from exc
                logger.warning("a replica failed under a %s call; sending it again", method)

    async def _stream(self, payload: dict, offset: int) -> AsyncIterator[dict]:
        for attempt in (1, 2):
            started = False
            chunks = self.handle.options(stream=True).generate_stream.remote(payload)
            try:
                async for chunk in chunks:
                    started = True
                    yield chunk | {"index": chunk["index"] + offset}
                return
            except LOST as exc:
                if started or attempt == 2:
                    raise ApiError(
                        503, f"the replica streaming this failed: {exc}", "server_error"
                    ) from exc
                logger.warning("a replica failed before streaming; starting again")
            finally:
                chunks.cancel()  # a no-op once finished; a hang-up aborts the replica's work

    # ---- the replicas' state (called on worker threads) ----------------------------------

    @property
    def cpu_profile(self) -> None:
        """None: each replica chose its own CPU paths (its ``/server_info`` says which)."""
        return None

    @property
    def weights(self) -> dict:
        """Empty: the front door loads no weights."""
        return {}

    def replicas(self) -> dict[str, dict]:
        """Each live replica's latest summary (cache stats, load, digest size)."""
        return ray.get(self.directory.replicas.remote())

    def cache_stats(self) -> dict:
        """The replicas' stats summed: the token hit rate recomputed, usage and the share
        of requests that hit averaged, latency quantiles the worst replica's."""
        summaries = list(self.replicas().values())
        if not summaries:
            raise ApiError(503, "no engine replica has reported yet", "server_error")
        total: dict = {"replicas": len(summaries)}
        for s in summaries:
            for key, value in s.items():
                if not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                if key.endswith(QUANTILES):
                    total[key] = max(total.get(key, value), value)
                else:
                    total[key] = total.get(key, 0) + value
        for key in MEANS:
            if key in total:
                total[key] /= len(summaries)
        queried = max(1, total.get("queried_tokens", 0))
        total["token_hit_rate"] = total.get("hit_tokens", 0) / queried
        return total

    def flush_cache(self) -> bool:
        return all(self._broadcast("flush_cache"))

    def check_invariants(self) -> None:
        self._broadcast("check_invariants")

    def _broadcast(self, method: str) -> list:
        return [
            getattr(self.handle, method)
            .remote({"replica": r})
            .result(timeout_s=BROADCAST_TIMEOUT_S)
            for r in self.replicas()
        ]

    def shutdown(self) -> None:
        """Nothing to stop here: Serve owns the replicas."""


def _payload(ids, params: SamplingParams, namespace, affinity: str | None) -> dict:
    return {
        "input_ids": ids,
        "sampling_params": params,
        "namespace": namespace,
        "affinity": affinity,
    }


def _as_list(out) -> list:
    return out if isinstance(out, list) else [out]


async def _merge(streams: list[AsyncIterator[dict]]) -> AsyncIterator[dict]:
    """The chunks of several streams as they come; closing it closes them all."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream):
        try:
            async for chunk in stream:
                await queue.put(chunk)
            await queue.put(done)
        except Exception as exc:
            await queue.put(exc)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        finished = 0
        while finished < len(tasks):
            item = await queue.get()
            if item is done:
                finished += 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
