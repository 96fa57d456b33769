"""A radix tree drawn as text, one node a line: its first tokens, lock count and access tick
(what tests compare to show an operation changed nothing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.cache.tokens import TOKEN_BYTES, decode_tokens
from radixserve.cache.tree_node import TreeNode

if TYPE_CHECKING:
    from radixserve.cache.radix import RadixCache


def draw_radix(cache: RadixCache, max_tokens: int = 8) -> str:
    lines = []

    def visit(node: TreeNode, depth: int) -> None:
        ids = decode_tokens(node.key[: max_tokens * TOKEN_BYTES])
        more = " ..." if node.num_tokens > max_tokens else ""
        lines.append(
            f"{'  ' * depth}- {node.num_tokens} tokens {ids}{more} "
            f"lock={node.lock_ref} t={node.last_access}"
        )
        for child in node.children.values():
            visit(child, depth + 1)

    for namespace, root in cache._roots.items():
        lines.append(f"namespace {namespace!r}")
        for child in root.children.values():
            visit(child, 1)
    lines.append(
        f"total={cache.total_size} evictable={cache.evictable_size} "
        f"protected={cache.protected_size}"
    )
    return "\n".join(lines)
