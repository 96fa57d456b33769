"""The token hit rate of a cache with unlimited memory on calls given as token ids (what the
demo and the benchmarks set their hit rates beside; ``replay.optimal`` is a trace's)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from radixserve.cache import RadixCache


def optimal_hit_rate(
    calls: Iterable[tuple[Sequence[int], Sequence[int] | None]], page_size: int = 1
) -> float:
    """The token hit rate of a cache with unlimited memory serving ``(prompt, output)`` calls
    one at a time in order: each distinct whole page of prefix is computed once (and a page
    beginning like a later prompt serves that head: ``serving_prefix``); every call computes
    at least its last prompt token (its logits give the first output); a reply's
    tokens but the last had their K/V computed while decoding, so a later prompt that
    repeats them hits them."""
    cache = RadixCache(page_size)  # simulation mode: slots are plain ints
    hits = total = 0
    for prompt, output in calls:
        prompt = np.asarray(prompt, dtype=np.int32)
        hits += cache.serving_prefix(prompt, cache.match_prefix(prompt), len(prompt) - 1)[0]
        total += len(prompt)
        seen = (
            prompt
            if output is None or len(output) < 2
            else np.concatenate([prompt, np.asarray(output[:-1], dtype=np.int32)])
        )
        cache.insert(seen, np.arange(len(seen)))
    return hits / total if total else 0.0
