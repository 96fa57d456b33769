"""The radix tree's walk, timed for ``bench kernels``: with and without the native edge scan
(``csrc``'s first-mismatch scan against the binary search of ``memcmp``s it replaces)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from radixserve.bench.cache_bench import TreeShape, _unseen_tokens, build_tree
from radixserve.bench.timing import per_call
from radixserve.cache.tokens import encode_tokens


def matcher_rows(tree_tokens: int, hit: int, page_size: int, seed: int) -> list[dict]:
    """The walk for a full ``hit``-token hit and for a query leaving a long edge halfway
    (where the scan matters), with and without the native scan; p50 over 1,000 walks of
    random prompts, each right after its key is encoded (as ``match_prefix`` does), and of
    whole matches."""
    shape = TreeShape.for_sizes(tree_tokens, hit)
    rng = np.random.default_rng(seed)
    cache, first_turns = build_tree(shape, page_size, rng)
    picks = rng.integers(0, len(first_turns), 1000)
    hits = [np.concatenate([first_turns[i], _unseen_tokens(rng, 64)]) for i in picks]
    partial = []
    for q in hits:
        q = q.copy()
        q[shape.prompt_len // 2 :] = _unseen_tokens(rng, len(q) - shape.prompt_len // 2)
        partial.append(q)
    native = cache._native
    rows = []
    for case, queries in (("full hit", hits), ("leaves an edge halfway", partial)):
        p50 = {}
        for name, impl in (("python", None), ("native", native)):
            cache._native = impl
            p50[name] = _p50_us(queries, lambda key: cache._walk(key, None), encode_tokens)
        rows.append(
            {
                "kernel": "matcher",
                "case": f"{case}, {shape.tree_tokens:,}-token tree",
                "python_walk_us": p50["python"],
                "native_walk_us": p50["native"] if native is not None else None,
                "match_prefix_us": _p50_us(queries, cache.match_prefix),
            }
        )
    return rows


def _p50_us(
    queries: Sequence[np.ndarray],
    timed: Callable[[object], object],
    prepare: Callable[[np.ndarray], object] = lambda q: q,
) -> float:
    """p50 µs of ``timed(prepare(q))`` over ``queries``."""
    return float(np.median(per_call(queries, timed, prepare)) * 1e6)
