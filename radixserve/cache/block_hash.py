"""A block-hash prefix index, the way vLLM's automatic prefix caching keeps one: for
comparison with the radix tree on the same engine.

Each full page ("block") of a sequence is keyed by a hash chain
``H(parent_hash, block_tokens)`` with SHA-256, starting from a salted root per namespace, so a
block's hash names its whole prefix. A hash table maps block hashes to blocks; a lock
references every block of a matched chain. Unreferenced blocks wait in an insertion-ordered
free queue (O(1) to append, touch, remove and pop) and stay hit-able until evicted.

Every touch (a lookup, an insert, an unlock) re-queues a chain tail first, so a free block
always sits ahead of its free parent: eviction takes a chain from its tail and never leaves
a block whose parent is gone.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from radixserve.cache.base import (
    BasePrefixCache,
    CacheInvariantError,
    CacheStats,
    InsertResult,
    Namespace,
    PrefixMatch,
)
from radixserve.cache.slot_checks import (
    EMPTY_SLOTS,
    check_page_size,
    check_slots,
    check_whole_pages,
)
from radixserve.cache.tokens import TOKEN_BYTES, decode_tokens, encode_tokens
from radixserve.memory import KVSlotAllocator


class Block:
    __slots__ = ("block_hash", "namespace", "parent_hash", "ref_count", "slots", "tokens")

    def __init__(self, block_hash, parent_hash, tokens, slots, namespace) -> None:
        self.block_hash: bytes = block_hash
        self.parent_hash: bytes = parent_hash
        self.tokens: bytes = tokens  # the page's token ids as int32 bytes
        self.slots: np.ndarray = slots
        self.namespace: Namespace = namespace
        self.ref_count = 0


def root_hash(namespace: Namespace) -> bytes:
    """The chain's starting value: a namespace never shares a block with another."""
    return hashlib.sha256(b"radixserve-namespace:" + repr(namespace).encode()).digest()


def block_hash(parent_hash: bytes, tokens: bytes) -> bytes:
    return hashlib.sha256(parent_hash + tokens).digest()


def _chain_match(blocks: list[Block]) -> PrefixMatch:
    if not blocks:
        return PrefixMatch(0, EMPTY_SLOTS, None)
    slots = np.concatenate([b.slots for b in blocks])
    return PrefixMatch(len(slots), slots, blocks[-1])


class BlockHashCache(BasePrefixCache):
    def __init__(self, page_size: int = 16, allocator: KVSlotAllocator | None = None) -> None:
        check_page_size(page_size, allocator)
        self.page_size = page_size
        self.allocator = allocator
        self._page_bytes = page_size * TOKEN_BYTES
        self._clear()

    def _clear(self) -> None:
        self._blocks: dict[bytes, Block] = {}
        self._free: OrderedDict[bytes, Block] = OrderedDict()  # unreferenced, LRU first
        self._protected_size = 0
        self._counters = dict.fromkeys(CacheStats.__dataclass_fields__, 0)

    # ---- queries -------------------------------------------------------------------------

    @property
    def evictable_size(self) -> int:
        return len(self._free) * self.page_size

    @property
    def protected_size(self) -> int:
        return self._protected_size

    def stats(self) -> CacheStats:
        return CacheStats(**self._counters)

    def _chain(self, key: bytes, namespace: Namespace) -> list[tuple[bytes, bytes]]:
        """(hash, page bytes) of every full page of ``key``."""
        out, parent, pb = [], root_hash(namespace), self._page_bytes
        for start in range(0, len(key) - len(key) % pb, pb):
            page = key[start : start + pb]
            parent = block_hash(parent, page)
            out.append((parent, page))
        return out

    # ---- lookups and inserts -------------------------------------------------------------

    def _matched_blocks(self, key: bytes, namespace: Namespace) -> list[Block]:
        matched: list[Block] = []
        parent, pb = root_hash(namespace), self._page_bytes
        for start in range(0, len(key) - len(key) % pb, pb):
            parent = block_hash(parent, key[start : start + pb])
            block = self._blocks.get(parent)
            if block is None:
                break
            matched.append(block)
        return matched

    def peek_prefix(
        self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None
    ) -> tuple[int, object]:
        matched = self._matched_blocks(encode_tokens(tokens), namespace)
        return len(matched) * self.page_size, matched[-1] if matched else None

    def match_prefix(
        self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None
    ) -> PrefixMatch:
        key = encode_tokens(tokens)
        matched = self._matched_blocks(key, namespace)
        for block in reversed(matched):  # the chain's head ends most recent, its tail older
            if block.ref_count == 0:
                self._free.move_to_end(block.block_hash)
        length = len(matched) * self.page_size
        c = self._counters
        c["lookups"] += 1
        c["queried_tokens"] += len(key) // TOKEN_BYTES
        if matched:
            c["hit_lookups"] += 1
            c["hit_tokens"] += length
        return _chain_match(matched)

    def insert(
        self,
        tokens: Sequence[int] | np.ndarray,
        slots: Sequence[int] | np.ndarray,
        namespace: Namespace = None,
    ) -> InsertResult:
        key = encode_tokens(tokens)
        slots = check_slots(slots, len(key) // TOKEN_BYTES)
        chain = self._chain(key, namespace)
        already = 0  # the leading blocks already cached (no later one is: no orphans)
        while already < len(chain) and chain[already][0] in self._blocks:
            already += 1
        page = self.page_size
        new_slots = slots[already * page : len(chain) * page]
        if self.allocator is not None and new_slots.size:
            check_whole_pages(new_slots, self.allocator)
        parent = chain[already - 1][0] if already else root_hash(namespace)
        added = []
        for i in range(already, len(chain)):
            h, page_bytes = chain[i]
            own = new_slots[(i - already) * page : (i - already + 1) * page].copy()
            added.append(Block(h, parent, page_bytes, own, namespace))
            parent = h
        for block in reversed(added):
            self._blocks[block.block_hash] = block
            self._free[block.block_hash] = block
        self._counters["inserted_tokens"] += len(added) * page
        for i in reversed(range(already)):  # refresh the cached part as a lookup would
            block = self._blocks[chain[i][0]]
            if block.ref_count == 0:
                self._free.move_to_end(block.block_hash)
        blocks = [self._blocks[h] for h, _ in chain]
        return InsertResult(already * page, _chain_match(blocks))

    # ---- locks ---------------------------------------------------------------------------

    def _path(self, node: object) -> list[Block]:
        """The chain from the root down to ``node`` (a handle from ``match_prefix``)."""
        if not isinstance(node, Block):
            raise TypeError(f"expected a handle from match_prefix, got {type(node).__name__}")
        if self._blocks.get(node.block_hash) is not node:
            raise ValueError("this block was evicted; lock handles before anything can evict")
        path = [node]
        root = root_hash(node.namespace)
        while path[-1].parent_hash != root:
            path.append(self._blocks[path[-1].parent_hash])
        return path

    def lock(self, node: object) -> None:
        if node is None:  # an empty match
            return
        for block in self._path(node):
            if block.ref_count == 0:
                del self._free[block.block_hash]
                self._protected_size += self.page_size
            block.ref_count += 1

    def unlock(self, node: object) -> None:
        if node is None:
            return
        path = self._path(node)
        if path[0].ref_count <= 0:
            raise ValueError("unlock of a block that holds no lock")
        for block in path:  # tail first, so a chain's tail is evicted before its head
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_hash] = block
                self._protected_size -= self.page_size

    # ---- eviction ------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        freed_slots = []
        while len(freed_slots) * self.page_size < num_tokens and self._free:
            _, block = self._free.popitem(last=False)
            del self._blocks[block.block_hash]
            freed_slots.append(block.slots)
        freed = len(freed_slots) * self.page_size
        self._counters["evicted_tokens"] += freed
        if self.allocator is not None and freed_slots:
            self.allocator.free(np.concatenate(freed_slots))
        return freed

    def reset(self) -> None:
        if self._protected_size:
            raise RuntimeError(
                f"cannot reset the prefix cache while {self._protected_size} tokens are locked"
            )
        if self.allocator is not None and self._blocks:
            self.allocator.free(np.concatenate([b.slots for b in self._blocks.values()]))
        self._clear()

    # ---- inspection ----------------------------------------------------------------------

    def check_invariants(self, slots_held_outside: int = 0) -> None:
        def require(ok: bool, message: str) -> None:
            if not ok:
                raise CacheInvariantError(message)

        protected = 0
        queue_position = {h: i for i, h in enumerate(self._free)}
        for h, block in self._blocks.items():
            require(block.block_hash == h, "a block is filed under another hash")
            require(block_hash(block.parent_hash, block.tokens) == h, "a block's hash is stale")
            require(len(block.slots) == self.page_size, "a block is not one page")
            require(block.ref_count >= 0, f"negative reference count {block.ref_count}")
            require((block.ref_count == 0) == (h in self._free), "free queue membership wrong")
            if block.parent_hash != root_hash(block.namespace):
                parent = self._blocks.get(block.parent_hash)
                require(parent is not None, "a block's parent is gone (an orphan)")
                require(parent.ref_count >= block.ref_count, "parent less locked than child")
                if block.ref_count == 0 and parent.ref_count == 0:
                    require(
                        queue_position[h] < queue_position[parent.block_hash],
                        "a free block would be evicted after its parent",
                    )
            protected += self.page_size if block.ref_count else 0
        require(len(self._free) <= len(self._blocks), "the free queue holds unknown blocks")
        require(
            protected == self._protected_size, f"protected {self._protected_size} != {protected}"
        )
        slots = (
            np.concatenate([b.slots for b in self._blocks.values()])
            if self._blocks
            else EMPTY_SLOTS
        )
        require(np.unique(slots).size == slots.size, "a slot appears twice in the index")
        alloc = self.allocator
        if alloc is not None:
            require(alloc.is_allocated(slots), "the index holds slots the allocator thinks free")
            total = len(self._blocks) * self.page_size
            require(
                alloc.num_free + total + slots_held_outside == alloc.capacity,
                f"free {alloc.num_free} + cached {total} + held outside {slots_held_outside} "
                f"!= capacity {alloc.capacity}",
            )

    def pretty_print(self, max_tokens: int = 8) -> str:
        lines = [f"block-hash index: {len(self._blocks)} blocks of {self.page_size} tokens"]
        for h, b in self._blocks.items():
            tokens = decode_tokens(b.tokens)[:max_tokens]
            lines.append(
                f"  {h.hex()[:8]} <- {b.parent_hash.hex()[:8]} {b.namespace!r} refs {b.ref_count}:"
                f" {tokens} -> {b.slots[:max_tokens].tolist()}"
            )
        text = "\n".join(lines)
        print(text)
        return text
