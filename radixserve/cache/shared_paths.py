"""Which of a batch's requests share a path in the radix tree, for cascade attention.

Requests holding locks on nodes below a common node share that node's whole path: the same
slots for the same first tokens. Attention over those slots can then be computed once for
all of them. Given each request's locked node, pick the groups that save the most reads:
at a node reached by ``c >= 2`` requests, grouping them there saves ``(c - 1) * depth``
key reads; grouping subsets deeper may save more. One level of groups per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from radixserve.cache.tree_node import TreeNode


@dataclass(frozen=True)
class PrefixGroupRule:
    """Which prefix groups (``batch.prefix_groups``, cascade attention) a backend runs:
    requests sharing at least ``min_shared`` cached tokens, each with at most
    ``max_member_tokens`` new tokens, together at least ``min_group_tokens``. The scheduler
    forms only such groups, so the backend runs every group it is given."""

    min_shared: int
    min_group_tokens: int = 1
    max_member_tokens: int | None = None

    def takes_member(self, extend_len: int) -> bool:
        return self.max_member_tokens is None or extend_len <= self.max_member_tokens

    def takes_group(self, extend_lens: Sequence[int]) -> bool:
        return len(extend_lens) >= 2 and sum(extend_lens) >= self.min_group_tokens


@dataclass(frozen=True)
class PrefixGroup:
    """Requests of a batch (by index) whose first ``shared_len`` context slots are the same
    slots: the path they share in the radix tree."""

    shared_len: int
    members: tuple[int, ...]


def group_shared_paths(
    nodes: Sequence[TreeNode | None], lengths: Sequence[int], min_len: int
) -> list[tuple[int, list[int]]]:
    """``(shared_len, positions)`` groups over ``nodes`` (positions index ``nodes``), each
    with >= 2 members sharing >= ``min_len`` tokens. Member ``i`` only offers the nodes of
    its path that end within its first ``lengths[i]`` tokens (the part it reads from the
    tree); ``None`` and root nodes share nothing."""
    members: dict[TreeNode, list[int]] = {}
    depth: dict[TreeNode, int] = {}
    kids: dict[TreeNode, list[TreeNode]] = {}
    tops: list[TreeNode] = []
    for i, node in enumerate(nodes):
        path = []
        while node is not None and not node.is_root:
            path.append(node)
            node = node.parent
        d = 0
        for parent, child in zip([None, *path[::-1]], path[::-1], strict=False):
            d += child.num_tokens
            if d > lengths[i]:
                break
            if child not in members:
                members[child], depth[child] = [], d
                (kids.setdefault(parent, []) if parent else tops).append(child)
            members[child].append(i)

    def best(node: TreeNode) -> tuple[int, list[tuple[int, list[int]]]]:
        here = members[node]
        if len(here) < 2:
            return 0, []
        saved, groups = 0, []
        for child in kids.get(node, []):
            s, g = best(child)
            saved, groups = saved + s, groups + g
        own = (len(here) - 1) * depth[node] if depth[node] >= min_len else 0
        return (own, [(depth[node], here)]) if own > 0 and own >= saved else (saved, groups)

    return [g for top in tops for g in best(top)[1]]


def check_group(
    group: PrefixGroup,
    prefix: np.ndarray,
    kv_start: np.ndarray,
    kv_slots: np.ndarray | None,
    shared: np.ndarray,
) -> None:
    """Refuse a group whose members do not really share their first ``shared_len`` cached
    slots, or that claims a request another group (marked in ``shared``) already has."""
    m, n = list(group.members), group.shared_len
    if len(m) < 2 or n < 1:
        raise ValueError(f"a prefix group needs >= 2 members and a shared length: {group}")
    if len(set(m)) != len(m) or shared[m].any():
        raise ValueError(f"a request belongs to at most one prefix group: {group}")
    if (prefix[m] < n).any():
        raise ValueError(f"a shared prefix must be cached for every member: {group}")
    if kv_slots is None:
        raise ValueError("checking a prefix group needs the batch's kv_slots")
    first = kv_slots[kv_start[m[0]] : kv_start[m[0]] + n]
    for i in m[1:]:
        if not np.array_equal(kv_slots[kv_start[i] : kv_start[i] + n], first):
            raise ValueError(f"request {i} does not share the first {n} slots of {group}")
