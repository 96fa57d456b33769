"""What one forward pass computes, as the scheduler hands it to the model runner: each
request's span of positions, the tree paths its requests share (read once for all of them
by the attention backend) and the cached K/V it copies before reading it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixserve.cache import BasePrefixCache
from radixserve.cache.shared_paths import PrefixGroupRule
from radixserve.engine.metrics import EngineMetrics
from radixserve.engine.req import Req
from radixserve.engine.scheduler.step_budget import step_features


@dataclass(frozen=True)
class Work:
    """One request's part of a forward: compute positions [start, end) of its sequence."""

    req: Req
    start: int
    end: int
    decode: bool = False  # the next token of a request whose prompt is computed
    # draft tokens this pass verifies after the request's last one (speculative decoding):
    # [seq_len, end) are theirs; they join the sequence only as far as they are accepted
    draft: tuple[int, ...] = ()

    @property
    def reaches_end(self) -> bool:
        return self.end == self.req.seq_len + len(self.draft)

    @property
    def samples(self) -> bool:
        """Whether this pass's logits give a token: it reaches the end of the sequence of a
        request that wants tokens (``max_new_tokens=0`` only fills the cache)."""
        return self.reaches_end and self.req.params.max_new_tokens > 0


@dataclass(frozen=True)
class ScheduleBatch:
    work: list[Work]
    # (shared_len, positions in work): requests whose first shared_len slots are one tree path
    prefix_groups: list[tuple[int, list[int]]] = field(default_factory=list)
    # (src, dst) slots whose cached K/V the pass copies before it reads them (ReqKV.page_copy)
    kv_copies: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def decode(self) -> bool:
        return all(w.decode for w in self.work)

    def features(self) -> np.ndarray:
        """The step's shape, as the cost model reads it."""
        ext = [(w.end - w.start, w.start) for w in self.work if not w.decode]
        return step_features(ext, [w.end for w in self.work if w.decode])


def take_copies(work: list[Work]) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached K/V this pass copies for its requests before reading it (admission queued
    them; a request admitted in an earlier step's plan but not run yet too)."""
    copies = [w.req.kv.page_copy for w in work if w.req.kv.page_copy is not None]
    for w in work:
        w.req.kv.page_copy = None
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
        [work[i].req.kv.last_node for i in members],
        [work[i].req.kv.cached_len for i in members],
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
