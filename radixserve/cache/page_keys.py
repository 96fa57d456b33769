"""Keys that name a page of tokens *and everything before it*: a hash chain over the token
ids, page by page, from a root salted by the namespace and a fingerprint (of the model,
dtype, page size and layout), so no key crosses tenants or models. The lower KV tiers store
pages under them; replicas describe their trees to a router with them."""

from __future__ import annotations

import hashlib

import numpy as np

KEY_BYTES = 16


def root_key(namespace: object, fingerprint: str) -> bytes:
    return hashlib.blake2b(f"{fingerprint}|{namespace!r}".encode(), digest_size=KEY_BYTES).digest()


def page_keys(tokens: np.ndarray, page_size: int, root: bytes) -> list[bytes]:
    """One key per whole page of ``tokens``."""
    return chain_keys(root, np.ascontiguousarray(tokens, dtype=np.int32).tobytes(), page_size)


def chain_keys(prev: bytes, data: bytes, page_size: int) -> list[bytes]:
    """The keys of the whole pages of ``data`` (int32 token bytes) following the page whose
    key is ``prev``."""
    step = 4 * page_size
    keys = []
    for start in range(0, len(data) - len(data) % step, step):
        prev = hashlib.blake2b(prev + data[start : start + step], digest_size=KEY_BYTES).digest()
        keys.append(prev)
    return keys
