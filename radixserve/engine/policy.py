"""Orders the waiting queue.

``lpm`` admits the request with the longest cached prefix first so shared prefixes stay hot,
with aging: each second of waiting counts as ``aging`` cached tokens, so a request that shares
nothing is not starved behind an endless stream of hits (plain LPM gives such requests
tail latencies of tens of seconds at high hit rates).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from radixserve.engine.req import Req


def order_waiting(
    waiting: list[Req],
    policy: str,
    cached_len: Callable[[Req], int],
    aging_tokens_per_s: float,
    rng: random.Random,
) -> list[Req]:
    if policy == "fcfs":
        return sorted(waiting, key=lambda r: r.arrival_s)
    if policy == "random":
        order = list(waiting)
        rng.shuffle(order)
        return order
    now = time.perf_counter()
    return sorted(
        waiting,
        key=lambda r: (-(cached_len(r) + aging_tokens_per_s * (now - r.arrival_s)), r.arrival_s),
    )
