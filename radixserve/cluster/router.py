"""Ray Serve request routers for the ``engine`` deployment (they run in the front door's
process, one per handle).

- ``PrefixRouter``: sends a request where the tokens a replica's tree already holds, minus
  the work queued there beyond a tolerance, save the most: within ``tolerance_tokens`` of
  the idlest replica load costs nothing (a busy replica that holds the prefix does less
  work in all than an idle one that must compute it), past it every queued token counts,
  so a prefix too hot for one replica spreads to a second. What a tree holds comes from
  each replica's digest (``cache.digest``, refreshed every routing-stats period) and, until
  the next digest shows them, the router's own recent sends; a replica's load is the
  prefill it reports queued plus what this router sent it since that report and it has
  not answered yet. Nothing matching anywhere: the replica the request's affinity key
  (OpenAI's ``prompt_cache_key``) hashes to, unless it is busy past the tolerance; else
  power of two choices on load.
- ``RoundRobinRouter`` and ``PowerOfTwoRouter``: the baselines.

Every router honours ``payload["replica"]``: the front door addressing one replica.
Serve then takes the least loaded replica of the first rank that has room.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
import time
from collections import OrderedDict

import numpy as np
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from radixserve.cache.digest import short
from radixserve.cache.page_keys import page_keys, root_key

Ranks = list[list[RunningReplica]]


def _id(replica: RunningReplica) -> str:
    return replica.replica_id.unique_id


def _home(replicas: list[RunningReplica], affinity: str | None) -> RunningReplica | None:
    """The replica an affinity key maps to (the same one while the replicas stay)."""
    if not affinity:
        return None
    ordered = sorted(replicas, key=_id)
    digest = int.from_bytes(hashlib.blake2b(affinity.encode(), digest_size=8).digest(), "big")
    return ordered[digest % len(ordered)]


def _payload(request: PendingRequest | None) -> dict | None:
    if request is None or not request.args or not isinstance(request.args[0], dict):
        return None
    return request.args[0]


class _Router(RequestRouter):
    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> Ranks:
        payload = _payload(pending_request)
        target = None if payload is None else payload.get("replica")
        if target is not None:  # [] while it is gone: the caller's timeout ends the wait
            return [[r for r in candidate_replicas if r.replica_id.unique_id == target]]
        if payload is None or "input_ids" not in payload or len(candidate_replicas) < 2:
            return [candidate_replicas]
        return self.rank(candidate_replicas, payload, pending_request)

    def rank(self, replicas: list[RunningReplica], payload: dict, request: PendingRequest) -> Ranks:
        raise NotImplementedError


class PowerOfTwoRouter(_Router):
    def initialize_state(self, **kwargs) -> None:
        """Takes (and needs) none of the prefix router's settings."""

    def rank(self, replicas: list[RunningReplica], payload: dict, request: PendingRequest) -> Ranks:
        return [random.sample(replicas, 2)]


class RoundRobinRouter(_Router):
    def initialize_state(self, **kwargs) -> None:
        """Takes none of the prefix router's settings."""
        self._next = 0

    def rank(self, replicas: list[RunningReplica], payload: dict, request: PendingRequest) -> Ranks:
        ordered = sorted(replicas, key=lambda r: r.replica_id.unique_id)
        first = ordered[self._next % len(ordered)]
        self._next += 1
        return [[first], [r for r in ordered if r is not first]]


class PrefixRouter(_Router):
    def initialize_state(
        self,
        page_size: int,
        fingerprint: str,
        tolerance_tokens: int = 4096,
        remember_s: float = 5.0,
        remember_keys: int = 200_000,
    ) -> None:
        """``page_size`` and ``fingerprint``: how the replicas hash their pages;
        ``tolerance_tokens``: queued tokens above the idlest replica's that cost nothing;
        sends are remembered ``remember_s`` (a few routing-stats periods)."""
        self.page_size = page_size
        self.fingerprint = fingerprint
        self.tolerance_tokens = tolerance_tokens
        self.remember_s = remember_s
        self.remember_keys = remember_keys
        self._sent: OrderedDict[tuple[str, int], float] = OrderedDict()  # (replica, key) -> t
        self._digests: dict[str, tuple[int, frozenset[int]]] = {}  # replica -> (id, keys)
        self._lock = threading.Lock()  # completions are counted on Serve's threads
        # a number per send -> (replica, uncached tokens, when sent), until answered
        self._in_flight: dict[int, tuple[str, int, float]] = {}
        self._sends = itertools.count()
        self._costs: OrderedDict[int, int] = OrderedDict()  # id(request) -> uncached tokens

    def rank(self, replicas: list[RunningReplica], payload: dict, request: PendingRequest) -> Ranks:
        ids = payload["input_ids"]
        if len(ids) and not isinstance(ids[0], int | np.integer):
            ids = ids[0]  # several prompts: the front door sends them one by one
        root = root_key(payload.get("namespace"), self.fingerprint)
        keys = [short(k) for k in page_keys(np.asarray(ids), self.page_size, root)]
        page = self.page_size
        now = time.monotonic()
        self._forget(now)
        matched, load = {}, {}
        for r in replicas:
            rid = r.replica_id.unique_id
            held = self._held(r)
            depth = next(
                (
                    i + 1
                    for i in range(len(keys) - 1, -1, -1)
                    if keys[i] in held or (rid, keys[i]) in self._sent
                ),
                0,
            )
            matched[rid] = depth * page
            load[rid] = r.routing_stats.get("queued_tokens", 0) + self._sent_since(r)
        free = min(load.values()) + self.tolerance_tokens

        def saving(r: RunningReplica) -> tuple[float, float]:
            rid = r.replica_id.unique_id
            return matched[rid] - max(0, load[rid] - free), -load[rid]

        if any(matched.values()):
            chosen = max(replicas, key=saving)
        elif (home := _home(replicas, payload.get("affinity"))) and load[_id(home)] <= free:
            chosen = home  # the caller's affinity key (prompt_cache_key) picks, if not busy
        else:  # nothing to save anywhere: power of two choices on load
            chosen = min(random.sample(replicas, 2), key=lambda r: load[_id(r)])
        self._remember(chosen.replica_id.unique_id, keys, now)
        self._costs[id(request)] = len(ids) - matched[chosen.replica_id.unique_id]
        while len(self._costs) > 10_000:  # requests routed again, or never sent
            self._costs.popitem(last=False)
        return [[chosen], [r for r in replicas if r is not chosen]]

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        """Count the request's tokens against the replica that took it until it answers."""
        cost = self._costs.pop(id(pending_request), None)
        if cost is None:
            return
        key = next(self._sends)  # not id(): the request may be gone before its answer
        with self._lock:
            self._in_flight[key] = (replica_id.unique_id, cost, time.time())

        def answered(_) -> None:
            with self._lock:
                self._in_flight.pop(key, None)

        result.add_done_callback(answered)

    def _sent_since(self, replica: RunningReplica) -> int:
        """Uncached tokens sent to ``replica`` after its last report, still unanswered."""
        rid, reported = replica.replica_id.unique_id, replica.routing_stats.get("time", 0.0)
        with self._lock:
            return sum(c for r, c, t in self._in_flight.values() if r == rid and t > reported)

    def _held(self, replica: RunningReplica) -> frozenset[int]:
        """The replica's digest keys, rebuilt only when its stats change."""
        rid, stats = replica.replica_id.unique_id, replica.routing_stats
        cached = self._digests.get(rid)
        if cached is None or cached[0] != id(stats):
            cached = self._digests[rid] = (id(stats), frozenset(stats.get("keys", ())))
        return cached[1]

    def _remember(self, rid: str, keys: list[int], now: float) -> None:
        for key in keys:
            self._sent[(rid, key)] = now
            self._sent.move_to_end((rid, key))
        while len(self._sent) > self.remember_keys:
            self._sent.popitem(last=False)

    def _forget(self, now: float) -> None:
        while self._sent and next(iter(self._sent.values())) < now - self.remember_s:
            self._sent.popitem(last=False)
