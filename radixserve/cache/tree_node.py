"""A node of the radix tree: one edge of token ids and the KV slots that hold them."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from radixserve.cache.tokens import TOKEN_BYTES


class TreeNode:
    """An edge from ``parent`` to this node.

    ``key`` holds the edge's token ids as int32 bytes (a whole number of pages) and ``slots``
    their KV slots, one per token. ``children`` is keyed by the first page of each child's
    key, so two children never share a first page; ``heads`` groups the same children by
    their first token (for finding pages that begin like a query). ``lock_ref`` counts the
    users of every path that runs through this node; a parent's count is never below a
    child's. ``last_access`` is a tick of the tree's clock, unique among nodes; ``hits``
    counts the node's uses; ``evict_key`` is its place in the eviction policy's queue (see
    ``eviction.py``) while it is a candidate.
    """

    __slots__ = (
        "children",
        "evict_key",
        "evicted",
        "heads",
        "hits",
        "key",
        "last_access",
        "lock_ref",
        "namespace",
        "parent",
        "slots",
    )

    def __init__(
        self,
        key: bytes,
        slots: np.ndarray,
        parent: TreeNode | None,
        namespace: Hashable | None,
        last_access: int = 0,
    ) -> None:
        self.key = key
        self.slots = slots
        self.parent = parent
        self.namespace = namespace
        self.children: dict[bytes, TreeNode] = {}
        self.heads: dict[bytes, dict[bytes, TreeNode]] = {}
        self.lock_ref = 0
        self.last_access = last_access
        self.evicted = False
        self.hits = 0
        self.evict_key: tuple | None = None

    def add_child(self, child: TreeNode, first_page: bytes) -> None:
        """Hang ``child`` (whose key starts with ``first_page``) here, replacing any child
        keyed by that page."""
        self.children[first_page] = child
        self.heads.setdefault(first_page[:TOKEN_BYTES], {})[first_page] = child

    def remove_child(self, first_page: bytes) -> None:
        del self.children[first_page]
        group = self.heads[first_page[:TOKEN_BYTES]]
        del group[first_page]
        if not group:
            del self.heads[first_page[:TOKEN_BYTES]]

    @property
    def num_tokens(self) -> int:
        return len(self.slots)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __repr__(self) -> str:
        return (
            f"TreeNode(tokens={self.num_tokens}, children={len(self.children)}, "
            f"lock_ref={self.lock_ref}, last_access={self.last_access})"
        )
