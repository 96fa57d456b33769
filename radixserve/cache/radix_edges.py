"""Walking the radix tree's edges: following a key through whole matching pages, and cutting
an edge where a match ends inside it. Mixed into ``RadixCache``, whose ``_roots``,
``_page_bytes``, ``_native`` (the native matcher, or None) and ``_tick`` these use."""

from __future__ import annotations

from itertools import islice

import numpy as np

from radixserve.cache.base import Namespace, PageHead, PrefixMatch
from radixserve.cache.tokens import TOKEN_BYTES, encode_tokens
from radixserve.cache.tree_node import TreeNode

# Children beginning with a query's next token that a page-head search compares.
HEAD_CANDIDATES = 32


class RadixEdges:
    _roots: dict[Namespace, TreeNode]
    _page_bytes: int
    page_size: int

    def _walk(
        self, key: bytes, namespace: Namespace
    ) -> tuple[list[TreeNode], int, tuple[TreeNode, int] | None]:
        """Follow ``key`` from the namespace's root through whole matching pages; changes
        nothing.

        Returns the nodes fully matched (the root excluded), the matched length in bytes, and,
        when the match ends inside an edge, that edge's node with the bytes of it matched.
        """
        path: list[TreeNode] = []
        node = self._roots.get(namespace)
        if node is None:
            return path, 0, None
        pb = self._page_bytes
        end = len(key) - len(key) % pb
        pos = 0
        while pos < end:
            child = node.children.get(key[pos : pos + pb])
            if child is None:
                break
            edge = child.key
            if not key.startswith(edge, pos):
                matched = self._matching_bytes(key, pos, end, edge)
                return path, pos + matched, (child, matched)
            pos += len(edge)
            path.append(child)
            node = child
        return path, pos, None

    def _walk_and_split(self, key: bytes, namespace: Namespace) -> tuple[list[TreeNode], int]:
        """``_walk``, then split a partly matched edge so the path ends exactly at the match."""
        path, matched, partial = self._walk(key, namespace)
        if partial is not None:
            path.append(self._split(*partial))
        return path, matched

    def match_page_head(self, tokens, match: PrefixMatch) -> PageHead | None:
        """See ``BasePrefixCache.match_page_head``: among the children of the match's node
        whose first token is the next one (the newest ``HEAD_CANDIDATES``: under a shared
        prompt ending inside a page, thousands of children may begin alike), the one whose
        first page agrees longest."""
        node = self._check_handle(match.node)
        want = encode_tokens(tokens[match.length : match.length + self.page_size])
        group = node.heads.get(want[:TOKEN_BYTES]) if want else None
        best, best_bytes = None, 0
        for first_page, child in islice(reversed(group.items()), HEAD_CANDIDATES) if group else ():
            n = self._matching_bytes(want, 0, len(want), first_page, TOKEN_BYTES)
            if n > best_bytes:
                best, best_bytes = child, n
        length = min(best_bytes // TOKEN_BYTES, self.page_size - 1)
        return PageHead(length, best.slots[:length], best) if length else None

    def continuation(self, tokens, namespace: Namespace = None, limit: int = 8) -> np.ndarray:
        """See ``BasePrefixCache.continuation``: the tree path ``tokens`` follows (whole
        pages, then the tail inside the next edge), read on for ``limit`` tokens; where it
        forks, into the most recently used of the newest ``HEAD_CANDIDATES`` children."""
        key, pb = encode_tokens(tokens), self._page_bytes
        end = len(key) - len(key) % pb
        path, matched, partial = self._walk(key[:end], namespace)
        node = path[-1] if path else self._roots.get(namespace)
        if matched < end or node is None:
            return np.empty(0, dtype=np.int32)
        node, offset = partial if partial is not None else (node, len(node.key))
        tail, out, want = key[end:], b"", limit * TOKEN_BYTES
        while len(out) < want:
            if offset == len(node.key):  # at a fork: the children that go on like the tail
                group = node.heads.get(tail[:TOKEN_BYTES], {}) if tail else node.children
                fits = [
                    c
                    for c in islice(reversed(group.values()), HEAD_CANDIDATES)
                    if c.key.startswith(tail)
                ]
                if not fits:
                    break
                node, offset = max(fits, key=lambda c: c.last_access), 0
            elif tail and not node.key.startswith(tail, offset):
                break
            offset += len(tail)
            tail = b""
            taken = node.key[offset : offset + want - len(out)]
            out, offset = out + taken, offset + len(taken)
        return np.frombuffer(out, dtype=np.int32).copy()

    def _matching_bytes(
        self, key: bytes, pos: int, end: int, edge: bytes, pb: int | None = None
    ) -> int:
        """Bytes of whole pages (of ``pb`` bytes; the tree's by default) of ``edge`` that
        ``key[pos:end]`` matches; the first page is known to match. Natively one scan; else
        a binary search over pages, each probe one ``memcmp`` (the reference the native scan
        is tested against)."""
        pb = pb or self._page_bytes
        if self._native is not None:
            return self._native.matching_prefix(key, pos, edge, pb)
        lo, hi = 1, min(len(edge), end - pos) // pb
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if key.startswith(edge[: mid * pb], pos):
                lo = mid
            else:
                hi = mid - 1
        return lo * pb

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Cut ``node``'s edge ``at`` bytes in; returns the new upper node.

        ``node`` keeps its identity (handles to it stay valid) and becomes the lower part.
        """
        upper = TreeNode(
            node.key[:at],
            node.slots[: at // TOKEN_BYTES],
            node.parent,
            node.namespace,
            self._tick(),
        )
        upper.lock_ref = node.lock_ref
        node.parent.add_child(upper, upper.key[: self._page_bytes])
        node.key = node.key[at:]
        node.slots = node.slots[at // TOKEN_BYTES :]
        node.parent = upper
        upper.add_child(node, node.key[: self._page_bytes])
        return upper
