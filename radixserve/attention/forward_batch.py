"""What one forward pass computes: new tokens of several requests over the paged KV pool.

Every request is an *extend*: ``extend_len`` new tokens on top of ``prefix_len`` tokens whose
K/V are already in the pool (0 for a fresh prompt; a decode step is an extend of 1).
Tokens are laid out request after request:

    input_ids / positions / out_slots : [num_tokens]          new tokens, request by request
    kv_slots                          : [sum(seq_lens)]       each request's whole context
    seq_lens[b] = prefix_len[b] + extend_lens[b]

The attention backend builds its per-batch metadata once (``attn_metadata``) and every layer
reuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from radixserve.cache.shared_paths import PrefixGroup


@dataclass(frozen=True)
class ExtendRequest:
    """One request's part of a batch: its new token ids and its whole context's slots
    (``len(context_slots) == prefix_len + len(new_ids)``)."""

    new_ids: Sequence[int] | np.ndarray
    context_slots: np.ndarray

    @property
    def seq_len(self) -> int:
        return len(self.context_slots)

    @property
    def prefix_len(self) -> int:
        return self.seq_len - len(self.new_ids)


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_slots: torch.Tensor
    kv_slots: torch.Tensor
    extend_lens: list[int]
    seq_lens: list[int]
    page_size: int
    return_all_logits: bool = False
    # requests sharing their first slots (a radix-tree path); backends may ignore it
    prefix_groups: tuple[PrefixGroup, ...] = ()
    # (src, dst) slots: cached K/V copied to where this pass's requests read them (a cached
    # page's head, so a request computes only the tokens past it); see KVPool.write
    kv_copies: tuple[torch.Tensor, torch.Tensor] | None = None
    # per request, how many of its last new tokens reach the logits (None: its last one); a
    # request verifying draft tokens needs the distribution after each of them
    logit_lens: list[int] | None = None
    attn_metadata: Any = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    @property
    def prefix_lens(self) -> list[int]:
        return [s - e for s, e in zip(self.seq_lens, self.extend_lens, strict=True)]

    def logit_index(self) -> torch.Tensor:
        """The positions in ``input_ids`` whose logits the pass returns, request by request."""
        ends = np.cumsum(self.extend_lens)
        if self.logit_lens is None:
            index = ends - 1
        else:
            index = np.concatenate(
                [np.arange(e - n, e) for e, n in zip(ends, self.logit_lens, strict=True)]
            )
        return torch.from_numpy(index.astype(np.int64)).to(self.input_ids.device)

    @property
    def is_decode(self) -> bool:
        return all(e == 1 for e in self.extend_lens)

    @classmethod
    def create(
        cls,
        requests: Sequence[ExtendRequest],
        page_size: int,
        device: torch.device | str = "cpu",
        return_all_logits: bool = False,
        prefix_groups: Sequence[PrefixGroup] = (),
        kv_copies: tuple[np.ndarray, np.ndarray] | None = None,
        logit_lens: Sequence[int] | None = None,
    ) -> ForwardBatch:
        if not requests:
            raise ValueError("a forward batch needs at least one request")
        ids, positions, out_slots = [], [], []
        for req in requests:
            n = len(req.new_ids)
            if n < 1 or req.prefix_len < 0:
                raise ValueError(
                    f"each request needs >= 1 new token and a context covering them "
                    f"(got {n} new tokens, {req.seq_len} context slots)"
                )
            ids.append(np.asarray(req.new_ids, dtype=np.int64))
            positions.append(np.arange(req.prefix_len, req.seq_len, dtype=np.int64))
            out_slots.append(req.context_slots[req.prefix_len :])

        def tensor(parts: list[np.ndarray]) -> torch.Tensor:
            return torch.from_numpy(np.concatenate(parts).astype(np.int64)).to(device)

        src, dst = kv_copies or (None, None)

        return cls(
            input_ids=tensor(ids),
            positions=tensor(positions),
            out_slots=tensor(out_slots),
            kv_slots=tensor([r.context_slots for r in requests]),
            extend_lens=[len(r.new_ids) for r in requests],
            seq_lens=[r.seq_len for r in requests],
            page_size=page_size,
            return_all_logits=return_all_logits,
            prefix_groups=tuple(prefix_groups),
            kv_copies=None if kv_copies is None else (tensor([src]), tensor([dst])),
            logit_lens=None if logit_lens is None else list(logit_lens),
        )
