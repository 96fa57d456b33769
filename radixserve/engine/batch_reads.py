"""What a batch reads beside its own slots: the tree paths its requests share, read once for
all of them by the attention backend, and the cached K/V it copies before reading it."""

from __future__ import annotations

import numpy as np

from radixserve.cache import BasePrefixCache
from radixserve.cache.shared_paths import PrefixGroupRule
from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.schedule_batch import Work


def take_copies(work: list[Work]) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached K/V this pass copies for its requests before reading it (admission queued
    them; a request admitted in an earlier step's plan but not run yet too)."""
    copies = [w.req.kv_copy for w in work if w.req.kv_copy is not None]
    for w in work:
        w.req.kv_copy = None
    if not copies:
        return None
    return np.concatenate([c[0] for c in copies]), np.concatenate([c[1] for c in copies])


def prefix_groups(
    work: list[Work],
    rule: PrefixGroupRule | None,
    cache: BasePrefixCache,
    metrics: EngineMetrics,
) -> list[tuple[int, list[int]]]:
    """The tree paths the batch's requests share, among the groups the attention backend
    runs (``rule``; None: none)."""
    if rule is None or len(work) < 2:
        return []
    members = [i for i, w in enumerate(work) if rule.takes_member(w.end - w.start)]
    # A request may lock a longer match than it reads from the tree (prompt logprobs
    # recompute their span): only its first cached_len slots are the tree's.
    found = cache.shared_prefixes(
        [work[i].req.last_node for i in members],
        [work[i].req.cached_len for i in members],
        rule.min_shared,
    )
    groups = []
    for shared, positions in found:
        group = [members[p] for p in positions]
        if rule.takes_group([work[i].end - work[i].start for i in group]):
            groups.append((shared, group))
    metrics.cascade_groups += len(groups)
    metrics.cascade_saved_tokens += sum((len(m) - 1) * n for n, m in groups)
    return groups
