"""Which unlocked leaf the radix tree evicts next: the policies, behind one small interface.

The tree keeps the rules (only unlocked leaves are candidates; a parent becomes one when its
last child goes) and tells the policy when a node joins or leaves the candidates and when a
candidate is used; the policy only orders them. Each keeps its candidates in a sorted map
from a key fixed at the node's last use, so every call is O(log n):

- ``lru``: least recently used first (the key is the node's ``last_access`` tick).
- ``lfu``: least frequently used first, with dynamic aging (LFU-DA): a node's key is its use
  count plus the key of the last node evicted when it was last used, so what was popular
  long ago ages out instead of holding the cache forever; ties go least recently used.
- ``belady``: offline only (the simulator knows the future): the leaf whose tail page is
  needed again farthest in the future goes first. Only a leaf's tail page can be evicted
  before the rest of its path, so this is Belady's rule within the tree's leaf-first one.
"""

from __future__ import annotations

from collections.abc import Callable

from sortedcontainers import SortedDict

from radixserve.cache.tree_node import TreeNode

ONLINE_POLICIES = ("lru", "lfu")


class BaseEvictionPolicy:
    """The tree's candidates for eviction, in the order they go."""

    name = "base"

    def __init__(self) -> None:
        self._queue: SortedDict = SortedDict()  # key -> candidate

    def key(self, node: TreeNode) -> tuple:
        """The node's place in the queue, computed when it joins or is used."""
        raise NotImplementedError

    def add(self, node: TreeNode) -> None:
        node.evict_key = self.key(node)
        self._queue[node.evict_key] = node

    def remove(self, node: TreeNode) -> None:
        del self._queue[node.evict_key]

    def clear(self) -> None:
        self._queue.clear()

    def pop(self) -> TreeNode:
        """The next victim, taken out of the queue."""
        return self._queue.popitem(0)[1]

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, node: TreeNode) -> bool:
        key = node.evict_key
        return key is not None and self._queue.get(key) is node


class LRUEviction(BaseEvictionPolicy):
    name = "lru"

    def key(self, node: TreeNode) -> tuple:
        return (node.last_access,)


class LFUEviction(BaseEvictionPolicy):
    name = "lfu"

    def __init__(self) -> None:
        super().__init__()
        self._age = 0  # the key of the last node evicted

    def key(self, node: TreeNode) -> tuple:
        return (self._age + node.hits, node.last_access)

    def pop(self) -> TreeNode:
        key, node = self._queue.popitem(0)
        self._age = key[0]
        return node

    def clear(self) -> None:
        super().clear()
        self._age = 0


class BeladyEviction(BaseEvictionPolicy):
    """``next_use(node)``: when the node's tail page is next needed (larger is later; a
    page never needed again gives infinity)."""

    name = "belady"

    def __init__(self, next_use: Callable[[TreeNode], float]) -> None:
        super().__init__()
        self.next_use = next_use

    def key(self, node: TreeNode) -> tuple:
        return (-self.next_use(node), node.last_access)


def create_eviction_policy(name: str) -> BaseEvictionPolicy:
    """An online policy by name (``belady`` needs the future: build ``BeladyEviction``)."""
    policies = {"lru": LRUEviction, "lfu": LFUEviction}
    if name not in policies:
        raise ValueError(f"unknown eviction_policy {name!r}; choose one of {ONLINE_POLICIES}")
    return policies[name]()
