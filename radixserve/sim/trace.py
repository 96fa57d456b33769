"""Request traces for the simulator, read as chains of page ids.

Two JSONL formats, one request per line:

- **Mooncake's** published trace: ``timestamp``, ``input_length``, ``output_length``,
  ``hash_ids`` — one id per block of ``block_size`` tokens (512 in theirs), the same id at
  the same place meaning the same prefix through that block.
- **radixserve's**: ``timestamp``, ``input_ids`` (token ids) *or* ``hash_ids`` (as
  Mooncake's, with ``block_size``), ``output_length``, optional ``namespace`` (and
  ``input_length`` beside ``hash_ids``). ``Engine(record_trace=...)`` writes this format.

Each request becomes the ids of its prompt's whole pages of ``page_size`` tokens, each id
standing for the page *and everything before it* (so ids compare like tree paths), plus its
lengths. The simulator's tree holds page ids as its tokens, one per page; a trace that
mixes the two forms would give one chain two ids, so a file holds one form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMATS = ("auto", "mooncake", "radixserve")


@dataclass(frozen=True, eq=False)
class TraceRequest:
    timestamp: float
    pages: np.ndarray  # int64 ids of the prompt's whole pages, each naming its prefix too
    input_length: int
    output_length: int
    # recorded traces: the pages the engine cached past the prompt (None: the output's
    # pages are new ones no prompt names)
    output_pages: np.ndarray | None = None


class ChainIds:
    """Dense ids for chains: the same (chain before, namespace, content) always gets the
    same id, and nothing else does."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}

    def __call__(self, parent: int, namespace: object, content: object) -> int:
        key = (parent, namespace, content)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._ids)
        return found


def read_trace(
    path: str | Path, page_size: int, block_size: int = 512, fmt: str = "auto"
) -> list[TraceRequest]:
    """The requests of a trace file, in arrival order."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; choose one of {FORMATS}")
    if page_size < 1 or block_size < 1 or block_size % page_size:
        raise ValueError("block_size must be a whole number of pages (page_size >= 1)")
    ids = ChainIds()
    out = [to_request(row, ids, page_size, block_size, fmt) for row in _rows(Path(path))]
    return sorted(out, key=lambda r: r.timestamp)


def _rows(path: Path) -> Iterator[dict]:
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None


def to_request(
    row: dict, ids: ChainIds, page_size: int, block_size: int, fmt: str = "auto"
) -> TraceRequest:
    namespace = row.get("namespace")
    output_pages = None
    if fmt == "mooncake" or (fmt == "auto" and "input_ids" not in row):
        if "hash_ids" not in row or "input_length" not in row:
            raise ValueError(f"a hash-id row needs hash_ids and input_length: {row}")
        length = int(row["input_length"])
        block = int(row.get("block_size", block_size))
        if block % page_size:
            raise ValueError(f"block_size {block} is not a whole number of pages")
        # page j of the block chain c is c * per_block + j
        per_block, parent, chains = block // page_size, -1, []
        for h in [*row["hash_ids"], *row.get("output_hash_ids", ())]:
            parent = ids(parent, namespace, h)
            chains.append(parent)
        grid = np.asarray(chains, dtype=np.int64)[:, None] * per_block + np.arange(per_block)
        every = grid.reshape(-1)
        pages = every[: length // page_size]
        if "output_hash_ids" in row:
            output_pages = every[length // page_size :]
    else:
        length = len(row["input_ids"])
        pages = page_chain(row["input_ids"], ids, page_size, namespace)
    output = int(row.get("output_length", 0))
    return TraceRequest(float(row.get("timestamp", 0)), pages, length, output, output_pages)


def page_chain(
    tokens: Sequence[int], ids: ChainIds, page_size: int, namespace: object = None
) -> np.ndarray:
    """The ids of ``tokens``' whole pages, each naming its page and everything before it."""
    chain, parent = [], -1
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        parent = ids(parent, namespace, tuple(tokens[start : start + page_size]))
        chain.append(parent)
    return np.asarray(chain, dtype=np.int64)


def from_calls(
    calls: Iterable[tuple[Sequence[int], Sequence[int]]], page_size: int
) -> list[TraceRequest]:
    """``(prompt, output)`` calls in order as a trace that names each output's pages too,
    as a recorded one does: what a call leaves cached is its prompt and all but the last
    output token (whose K/V no pass computes)."""
    ids, out = ChainIds(), []
    for t, (prompt, output) in enumerate(calls):
        pages = page_chain([*prompt, *output[:-1]], ids, page_size)
        head = len(prompt) // page_size
        out.append(TraceRequest(t, pages[:head], len(prompt), len(output), pages[head:]))
    return out
