"""A bounded summary of what a radix tree holds, for routing across replicas: the chain
keys (``page_keys``) of its cached pages, truncated to 8 bytes. A router that hashes a
request's tokens the same way finds how far the replica's tree reaches into it without
seeing any tokens; namespaces are salted into the keys, so tenants stay apart.

When the tree has more pages than the bound, only every ``stride``-th page of each path is
kept (a power of two) and the last page of every leaf: a match is then found to within a
stride. A digest describes one moment; a stale one costs a miss, never a wrong answer (the
replica matches exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixserve.cache.page_keys import chain_keys, page_keys, root_key
from radixserve.cache.radix import RadixCache


def short(key: bytes) -> int:
    return int.from_bytes(key[:8], "little")


@dataclass(frozen=True)
class TreeDigest:
    keys: frozenset[int]
    stride: int
    page_size: int
    fingerprint: str

    def matched_tokens(self, tokens: np.ndarray, namespace: object) -> int:
        """Tokens of ``tokens`` the tree held, page-aligned (to within a stride)."""
        keys = page_keys(tokens, self.page_size, root_key(namespace, self.fingerprint))
        for i in range(len(keys) - 1, -1, -1):
            if short(keys[i]) in self.keys:
                return (i + 1) * self.page_size
        return 0

    def to_dict(self) -> dict:
        return {
            "keys": list(self.keys),
            "stride": self.stride,
            "page_size": self.page_size,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TreeDigest:
        return cls(frozenset(d["keys"]), d["stride"], d["page_size"], d["fingerprint"])


def tree_digest(cache: RadixCache, fingerprint: str, max_keys: int = 8192) -> TreeDigest:
    """The digest of ``cache`` now, at most ``max_keys`` keys (walks the whole tree: call
    it on the thread that owns the tree, every second or so)."""
    nodes = []  # (page keys of the node's edge, depth of its first page, is a leaf)
    for namespace, root in cache.roots().items():
        stack = [(child, root_key(namespace, fingerprint), 0) for child in root.children.values()]
        while stack:
            node, prev, depth = stack.pop()
            keys = chain_keys(prev, node.key, cache.page_size)
            if keys:
                nodes.append((keys, depth, not node.children))
                stack += [(c, keys[-1], depth + len(keys)) for c in node.children.values()]
    pages = sum(len(keys) for keys, _, _ in nodes)
    leaves = sum(leaf for _, _, leaf in nodes)
    stride = 1
    while pages // stride + leaves > max_keys and stride < pages:
        stride *= 2
    out: set[int] = set()
    for keys, depth, leaf in nodes:
        first = (-depth - 1) % stride  # the first page of the edge at a multiple of stride
        out.update(short(k) for k in keys[first::stride])
        if leaf:
            out.add(short(keys[-1]))
    kept = frozenset(sorted(out)[:max_keys]) if len(out) > max_keys else frozenset(out)
    return TreeDigest(kept, stride, cache.page_size, fingerprint)
