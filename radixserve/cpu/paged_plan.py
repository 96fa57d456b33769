"""The work list the native paged-attention kernel runs: which query rows meet which slots.

An *item* is a block of query rows against a contiguous stretch of one request's context
slots (a chunk of at most ``key_chunk`` keys), with a causal offset: row ``r`` sees the first
``clamp(causal_offset + r, 0, num_keys)`` keys of its stretch. Every row ends as a partial
softmax state; the kernel merges a token's rows by log-sum-exp. So

- a decode is one row per request, its context split in chunks (split-K, so one long
  context still spreads over every core);
- an extend is blocks of ``query_block`` tokens, each over the keys it may see;
- a shared prefix (cascade) is one set of items whose rows are *every* member's tokens over
  the group's common slots, read once for all of them, plus each member's private suffix;
  or, asked for, *block* items of every member's tokens over chunks of up to BLOCK_KEYS
  shared keys, which the kernel runs in its block kernel (``csrc/block_attention.cpp``:
  keys packed once, then tiles at the multiply-add rate) over all its threads.

``NativeMetadata`` is what the native backend leaves on a batch: this plan, the dense
blocks beside it, and whether the decode loop (``decode_layers.py``) may run the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from radixserve.cache.shared_paths import PrefixGroup, check_group

if TYPE_CHECKING:
    from radixserve.cpu.dense_blocks import DenseSplit

QUERY_BLOCK = 32
KEY_CHUNK = 512
MIN_CHUNK = 64
# A shared prefix is one block of work for many queries: cut it in at least this many
# chunks so that every core gets a share (the members' suffixes are small by comparison).
SHARED_MIN_CHUNKS = 8
_ALL = np.iinfo(np.int64).max // 4  # a causal offset that shows a row every key
BLOCK_KEYS = 1024  # longer paths' keys no longer stay in a core's cache


@dataclass(frozen=True)
class AttentionPlan:
    # [num_items, 6] int64: row0, rows, key_start, num_keys, causal_offset, block (0 or 1)
    items: torch.Tensor
    q_index: torch.Tensor  # [num_rows] int64: the token of each row
    merge_indptr: torch.Tensor  # [num_tokens + 1] int64
    merge_rows: torch.Tensor  # [num_rows] int64: rows ordered by token

    @property
    def num_rows(self) -> int:
        return len(self.q_index)


@dataclass(frozen=True)
class NativeMetadata:
    plan: AttentionPlan | None  # what the paged kernel runs; None: nothing
    dense: DenseSplit
    # every token is attended by ``plan`` alone, right after its K/V are stored (no dense
    # block, no K/V copy, no tier load pending): a decode step's layers may run in one call
    plan_only: bool


class _Builder:
    def __init__(self, query_block: int, key_chunk: int) -> None:
        self.query_block, self.key_chunk = query_block, key_chunk
        self.items: list[tuple[int, int, int, int, int, int]] = []
        self.rows: list[np.ndarray] = []
        self.num_rows = 0

    def add(
        self,
        tokens: np.ndarray,
        key_start: int,
        num_keys: int,
        causal_offset: int,
        min_chunks: int = 1,
    ) -> None:
        """Rows ``tokens`` (in order; row r sees ``causal_offset + r`` keys) over
        ``num_keys`` slots from ``key_start``, cut into query blocks and key chunks (at
        least ``min_chunks`` of them when each keeps >= MIN_CHUNK keys)."""
        for q0 in range(0, len(tokens), self.query_block):
            block = tokens[q0 : q0 + self.query_block]
            offset = causal_offset + q0
            seen = min(num_keys, offset + len(block) - 1)
            if seen <= 0:
                continue
            parts = max(-(-seen // self.key_chunk), min(min_chunks, seen // MIN_CHUNK))
            chunk = -(-seen // max(parts, 1))  # equal chunks of <= key_chunk
            for c in range(0, seen, chunk):
                n = min(chunk, num_keys - c)
                self.items.append((self.num_rows, len(block), key_start + c, n, offset - c, 0))
                self.rows.append(block)
                self.num_rows += len(block)

    def add_block(self, tokens: np.ndarray, key_start: int, num_keys: int) -> None:
        """Rows ``tokens`` over ``num_keys`` slots from ``key_start``, every row seeing every
        key: block items of at most BLOCK_KEYS keys."""
        parts = -(-num_keys // BLOCK_KEYS)
        chunk = -(-num_keys // parts)
        for c in range(0, num_keys, chunk):
            n = min(chunk, num_keys - c)
            self.items.append((self.num_rows, len(tokens), key_start + c, n, _ALL, 1))
            self.rows.append(tokens)
            self.num_rows += len(tokens)

    def build(self, num_tokens: int, every_token: bool) -> AttentionPlan:
        q_index = np.concatenate(self.rows) if self.rows else np.zeros(0, dtype=np.int64)
        counts = np.bincount(q_index, minlength=num_tokens)
        if every_token and (counts == 0).any():
            raise AssertionError("every token needs at least one row")
        indptr = np.zeros(num_tokens + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        return AttentionPlan(
            items=torch.tensor(self.items, dtype=torch.int64).reshape(-1, 6),
            q_index=torch.from_numpy(q_index.astype(np.int64)),
            merge_indptr=torch.from_numpy(indptr),
            merge_rows=torch.from_numpy(np.argsort(q_index, kind="stable").astype(np.int64)),
        )


def plan_attention(
    seq_lens: Sequence[int],
    extend_lens: Sequence[int],
    kv_slots: np.ndarray | None = None,
    groups: Sequence[PrefixGroup] = (),
    query_block: int = QUERY_BLOCK,
    key_chunk: int = KEY_CHUNK,
    keys_from: np.ndarray | None = None,
    block_groups: bool = False,
) -> AttentionPlan:
    """Plan a batch laid out as ``ForwardBatch`` lays it out (tokens and contexts request
    after request). ``groups`` need ``kv_slots`` (the batch's concatenated contexts) to be
    checked: members must really share their first ``shared_len`` slots, all cached.
    ``keys_from[i]``: request i's first context key this plan covers (the keys before it,
    and all of them at ``seq_lens[i]``, are attended elsewhere); its tokens may then have no
    rows, and leave an empty softmax state. ``block_groups``: each group's path becomes
    block items (``add_block``) rather than chunked ones."""
    seq = np.asarray(seq_lens, dtype=np.int64)
    ext = np.asarray(extend_lens, dtype=np.int64)
    kv_start = np.cumsum(seq) - seq
    q_start = np.cumsum(ext) - ext
    prefix = seq - ext
    shared = np.zeros(len(seq), dtype=np.int64)
    b = _Builder(query_block, key_chunk)
    for group in groups:
        check_group(group, prefix, kv_start, kv_slots, shared)
        m = np.asarray(group.members)
        tokens = np.concatenate([np.arange(q_start[i], q_start[i] + ext[i]) for i in m])
        if block_groups:
            b.add_block(tokens, int(kv_start[m[0]]), group.shared_len)
        else:
            b.add(tokens, int(kv_start[m[0]]), group.shared_len, _ALL, SHARED_MIN_CHUNKS)
        shared[m] = group.shared_len
    start = shared if keys_from is None else np.maximum(shared, keys_from)
    for i in range(len(seq)):
        s = int(start[i])
        tokens = np.arange(q_start[i], q_start[i] + ext[i])
        # Token j of the request sits at position prefix + j and sees keys 0 .. prefix + j.
        b.add(tokens, int(kv_start[i]) + s, int(seq[i]) - s, int(prefix[i]) - s + 1)
    return b.build(int(ext.sum()), every_token=keys_from is None)
