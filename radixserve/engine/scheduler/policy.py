"""Orders the waiting queue.

``dfs-weight`` walks the tree depth first, entering heavier subtrees (more waiting requests
below) first, and admits requests in that order, deepest matches before shallower ones, so
requests under one prefix run together.
``lpm`` admits the request with the longest cached prefix first so shared prefixes stay hot,
with aging: each second of waiting counts as ``aging`` cached tokens, so a request that shares
nothing is not starved behind an endless stream of hits (plain LPM gives such requests
tail latencies of tens of seconds at high hit rates).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable

from radixserve.engine.req import Req

LPM_WINDOW = 256


def order_waiting(
    waiting: list[Req],
    policy: str,
    match_node: Callable[[Req], tuple[int, object]],
    aging_tokens_per_s: float,
    rng: random.Random,
) -> list[Req]:
    """``match_node(req)`` gives the cached length of ``req``'s prefix and the deepest tree
    node it matches whole (an object with a ``parent``); it must not change the tree.
    Scoring looks every candidate up in the tree, so with a long queue only the oldest
    ``LPM_WINDOW`` are ordered each step (aging puts them first anyway)."""
    if len(waiting) > LPM_WINDOW:
        waiting = sorted(waiting, key=lambda r: r.arrival_s)[:LPM_WINDOW]
    if policy == "fcfs":
        return sorted(waiting, key=lambda r: r.arrival_s)
    if policy == "random":
        order = list(waiting)
        rng.shuffle(order)
        return order
    matches = {r: match_node(r) for r in waiting}
    if policy == "dfs-weight":
        return _dfs_weight(waiting, matches)
    now = time.perf_counter()
    return sorted(
        waiting,
        key=lambda r: (-(matches[r][0] + aging_tokens_per_s * (now - r.arrival_s)), r.arrival_s),
    )


def _dfs_weight(waiting: list[Req], matches: dict[Req, tuple[int, object]]) -> list[Req]:
    weight: dict[object, int] = defaultdict(int)
    children: dict[object, list] = defaultdict(list)
    ending: dict[object, list[Req]] = defaultdict(list)
    roots: list = []
    # Under one node, the requests matching further into one of its edges go first.
    for req in sorted(waiting, key=lambda r: (-matches[r][0], r.arrival_s)):
        node = matches[req][1]
        ending[node].append(req)
        while node is not None:
            weight[node] += 1
            parent = getattr(node, "parent", None)
            if weight[node] == 1:
                (children[parent] if parent is not None else roots).append(node)
            node = parent
    # Post-order: a node's own requests come after its subtree's, so the longest matches
    # under a prefix go first and requests matching nothing go last. (Pre-order admitted
    # the cold ones first; under memory pressure they evicted the prefixes the rest were
    # about to reuse: tree-of-thought at a quarter of its distinct tokens hit 34%, not 68%.)
    order: list[Req] = []
    stack = [(node, False) for node in sorted(roots, key=lambda n: weight[n])]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order += ending[node]
            continue
        stack.append((node, True))
        stack += [(child, False) for child in sorted(children[node], key=lambda n: weight[n])]
    return order + ending[None]  # matched nowhere in the index
