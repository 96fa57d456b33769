"""One engine replica of the ``engine`` deployment: the engine's calls by token ids (the
front door tokenized them), streams as async generators, and what the router weighs.

Every call takes one payload dict, ``{"input_ids", "sampling_params", "namespace"}`` for
generation, so the router reads what it routes on from one place; ``"replica"`` in it names
a replica to send the call to (the front door's broadcasts).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

import ray
from ray import serve

from radixserve.engine import Engine

DIGEST_KEYS = 8192  # per replica: ~70 KB of stats a second at most


class EngineReplica:
    def __init__(self, model: str, options: dict, directory: str, namespace: str) -> None:
        self.engine = Engine(model, **options)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._directory = ray.get_actor(directory, namespace=namespace)

    async def generate(self, payload: dict) -> dict | list:
        return await self.engine.async_generate(**_engine_args(payload))

    async def generate_stream(self, payload: dict):
        async with aclosing(self.engine.generate_stream(**_engine_args(payload))) as chunks:
            async for chunk in chunks:
                yield chunk

    async def check_grammar(self, payload: dict) -> None:
        await self.engine.check_grammar(payload["sampling_params"])

    async def flush_cache(self, payload: dict | None = None) -> bool:
        return await asyncio.to_thread(self.engine.flush_cache)

    async def check_invariants(self, payload: dict | None = None) -> None:
        await asyncio.to_thread(self.engine.check_invariants)

    async def record_routing_stats(self) -> dict:
        """Serve's call, every routing-stats period: the digest and load for the router;
        the summary goes to the directory on the way."""
        stats = await asyncio.to_thread(self.engine.routing_stats, DIGEST_KEYS)
        stats["time"] = time.time()  # what the router sent after this is not in it
        summary = await asyncio.to_thread(self.engine.cache_stats)
        summary |= {
            "replica": self.replica,
            "queued_tokens": stats["queued_tokens"],
            "digest_keys": len(stats["keys"]),
            "digest_stride": stats["stride"],
        }
        self._directory.report.remote(self.replica, summary)
        return stats

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()


def _engine_args(payload: dict) -> dict:
    return {
        "input_ids": payload["input_ids"],
        "sampling_params": payload["sampling_params"],
        "namespace": payload.get("namespace"),
    }
