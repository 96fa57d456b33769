"""Writes the requests an engine served as a trace ``radixserve simulate`` replays, without
the prompts: each whole page of token ids becomes a hash chained on the pages before it,
keyed by a salt drawn per file, so equal prefixes still compare equal inside one file and
nothing can be looked up across files.

One JSON line per finished request (radixserve's trace format): ``timestamp`` (seconds
since the engine started), ``input_length``, ``output_length``, ``block_size`` (the engine's
page size), ``hash_ids`` (the prompt's whole pages), ``output_hash_ids`` (the following whole
pages of what the engine computed and cached past the prompt), and ``namespace``
(salted too) when the request had one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from radixserve.engine.req import Req


class TraceRecorder:
    def __init__(self, path: str | Path, page_size: int) -> None:
        self.page_size = page_size
        self._salt = os.urandom(16)
        self._file = Path(path).open("w")  # noqa: SIM115 (open for the engine's life)
        self._started = time.perf_counter()

    def record(self, req: Req) -> None:
        page = self.page_size
        # the prompt, and past it what the engine offered the cache
        cached = req.seq()[: max(len(req.input_ids), req.kv.computed_len)]
        hashes = self._chain(cached, req.namespace)
        prompt_pages = len(req.input_ids) // page
        row = {
            "timestamp": round(req.arrival_s - self._started, 6),
            "input_length": len(req.input_ids),
            "output_length": len(req.output_ids),
            "block_size": page,
            "hash_ids": hashes[:prompt_pages],
            "output_hash_ids": hashes[prompt_pages:],
        }
        if req.namespace is not None:
            row["namespace"] = self._digest(repr(req.namespace).encode()).hex()
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()  # a trace read while the engine runs, or after a crash, is whole

    def close(self) -> None:
        self._file.close()

    def _chain(self, tokens: np.ndarray, namespace: object) -> list[int]:
        data = np.asarray(tokens, dtype=np.int32).tobytes()
        step = 4 * self.page_size
        out, prev = [], self._digest(repr(namespace).encode())
        for start in range(0, len(data) - len(data) % step, step):
            prev = self._digest(prev + data[start : start + step])
            out.append(int.from_bytes(prev, "little") >> 1)  # fits a signed 64-bit int
        return out

    def _digest(self, data: bytes) -> bytes:
        return hashlib.blake2b(data, digest_size=8, key=self._salt).digest()
