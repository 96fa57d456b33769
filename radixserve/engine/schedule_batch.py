"""What one forward pass computes, as the scheduler hands it to the model runner: each
request's span of positions, and which requests share a tree path."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixserve.engine.req import Req
from radixserve.engine.step_budget import step_features


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
    # (src, dst) slots whose cached K/V the pass copies before it reads them (Req.kv_copy)
    kv_copies: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def decode(self) -> bool:
        return all(w.decode for w in self.work)

    def features(self) -> np.ndarray:
        """The step's shape, as the cost model reads it."""
        ext = [(w.end - w.start, w.start) for w in self.work if not w.decode]
        return step_features(ext, [w.end for w in self.work if w.decode])
