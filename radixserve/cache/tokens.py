"""Token-id sequences as the tree stores them: int32 bytes.

Edges are kept as ``bytes`` (4 bytes per token) so that comparing a query with an edge is a
``memcmp`` (``bytes.startswith`` with an offset copies nothing), not a Python loop over ints
(two orders of magnitude slower). Callers on hot paths should hold token ids as
``numpy.int32`` arrays, which convert without a loop over Python ints.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TOKEN_BYTES = 4
_MAX_TOKEN_ID = np.iinfo(np.int32).max


def encode_tokens(tokens: Sequence[int] | np.ndarray) -> bytes:
    """Encode token ids as int32 bytes; raises ``ValueError`` unless they are ints in
    ``[0, 2**31)``."""
    arr = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
    if arr.size == 0:
        return b""
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"token ids must be a 1-D sequence of ints, got {arr.dtype} {arr.shape}")
    if arr.dtype == np.int32:
        # One reduction: negative int32 ids read as uint32 exceed the largest valid id. The
        # ufunc's own, not ``.max()``, which goes through a Python function first.
        out_of_range = np.maximum.reduce(arr.view(np.uint32)) > _MAX_TOKEN_ID
    else:
        out_of_range = arr.min() < 0 or arr.max() > _MAX_TOKEN_ID
    if out_of_range:
        raise ValueError(f"token ids must lie in [0, {_MAX_TOKEN_ID}]")
    return arr.astype(np.int32, copy=False).tobytes()


def decode_tokens(key: bytes) -> list[int]:
    """The token ids of an encoded key (for printing and tests)."""
    return np.frombuffer(key, dtype=np.int32).tolist()
