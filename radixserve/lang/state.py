"""A program's state: its token ids, text, messages and named results, extended by a worker
thread of its own.

``s += x`` only queues ``x``; the worker runs queued pieces in order against the backend. So
the branches of ``s.fork(n)`` run side by side (the engine batches their calls over the
shared, cached prefix) and ``s[name]`` blocks until the piece that sets ``name`` has run.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

from radixserve.lang.backend import BaseBackend
from radixserve.lang.fork_group import ForkGroup
from radixserve.lang.primitives import Gen, Role, Select


class ProgramError(RuntimeError):
    """A piece of a program failed; later pieces of that state do not run."""


_END = object()


class ProgramState:
    def __init__(self, backend: BaseBackend, defaults: dict, stream: bool = False) -> None:
        self.backend, self.defaults, self.stream = backend, defaults, stream
        self._ids: list[int] = []
        self._text = ""
        self._messages: list[dict] = []
        self._vars: dict[str, Any] = {}
        self._meta: dict[str, dict] = {}
        self._role: tuple[str, int] | None = None  # open role, text offset of its content
        self._error: BaseException | None = None
        self._pending = 0
        self._changed = threading.Condition()
        self._ops: queue.Queue = queue.Queue()
        self._pieces: queue.Queue = queue.Queue()  # text as it is produced, for text_iter
        self.children: list[ProgramState] = []
        self._group: ForkGroup | None = None  # siblings to meet at the first model call
        threading.Thread(target=self._work, daemon=True, name="radixserve-program").start()

    # ---- building the program ----------------------------------------------------------

    def __iadd__(self, other: Any) -> ProgramState:
        if isinstance(other, Role):
            self._submit(lambda: self._begin_role(other.role))
            for part in other.content:
                self._submit_piece(part)
            self._submit(self._end_role)
        else:
            self._submit_piece(other)
        return self

    def _submit_piece(self, piece: Any) -> None:
        if isinstance(piece, str):
            self._submit(lambda: self._append(piece))
        elif isinstance(piece, Gen):
            self._submit(lambda: self._gen(piece))
        elif isinstance(piece, Select):
            self._submit(lambda: self._select(piece))
        else:
            raise TypeError(f"cannot add {type(piece).__name__} to a program; use str, gen, select")

    def system(self) -> _RoleBlock:
        return _RoleBlock(self, "system")

    def user(self) -> _RoleBlock:
        return _RoleBlock(self, "user")

    def assistant(self) -> _RoleBlock:
        return _RoleBlock(self, "assistant")

    def fork(self, n: int) -> list[ProgramState]:
        """``n`` branches that start from this state as it stands once its queue has run."""
        if n < 1:
            raise ValueError(f"fork needs n >= 1, got {n}")
        self.sync()
        self._raise_if_failed()
        group = ForkGroup(self.backend.cache_prefix) if n > 1 else None
        branches = []
        for _ in range(n):
            b = ProgramState(self.backend, self.defaults, self.stream)
            b._ids, b._text, b._role = list(self._ids), self._text, self._role
            b._messages = list(self._messages)
            b._vars, b._meta = dict(self._vars), dict(self._meta)
            b._group = group
            branches.append(b)
        if group is not None:
            group.members = list(branches)
        self.children += branches
        return branches

    # ---- reading it --------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        with self._changed:
            self._changed.wait_for(lambda: name in self._vars or self._idle())
            if name in self._vars:
                return self._vars[name]
        self._raise_if_failed()
        raise KeyError(f"the program sets no variable {name!r}")

    def get_meta_info(self, name: str) -> dict:
        self[name]
        return self._meta[name]

    def text(self) -> str:
        self.sync()
        return self._text

    def token_ids(self) -> list[int]:
        self.sync()
        return list(self._ids)

    def tool_instructions(self, tools: list[dict]) -> str:
        """The text that tells this backend's model about ``tools`` (for a system message;
        a template with its own tool section is not used by programs, which write roles
        themselves)."""
        return self.backend.tool_format.instructions(tools)

    def tool_result(self, content: str) -> str:
        """A tool's result as the user turn that hands it back to the model."""
        return self.backend.tool_format.response(content)

    def messages(self) -> list[dict]:
        self.sync()
        return list(self._messages)

    def error(self) -> BaseException | None:
        return self._error

    def sync(self) -> None:
        """Wait until every queued piece has run (or the state has failed)."""
        with self._changed:
            self._changed.wait_for(self._idle)

    def text_iter(self) -> Iterator[str]:
        """The program's text as it is produced, until the program ends."""
        while (piece := self._pieces.get()) is not _END:
            yield piece

    async def text_async_iter(self) -> AsyncIterator[str]:
        while (piece := await asyncio.to_thread(self._pieces.get)) is not _END:
            yield piece

    def __repr__(self) -> str:
        return f"ProgramState(tokens={len(self._ids)}, vars={sorted(self._vars)})"

    # ---- the worker ----------------------------------------------------------------------

    def _idle(self) -> bool:
        return self._pending == 0 or self._error is not None

    def _submit(self, op: Callable[[], None]) -> None:
        with self._changed:
            self._pending += 1
        self._ops.put(op)

    def _work(self) -> None:
        while (op := self._ops.get()) is not _END:
            if self._error is None:
                try:
                    op()
                except Exception as exc:
                    self.record_error(exc)
            with self._changed:
                self._pending -= 1
                self._changed.notify_all()

    def record_error(self, exc: BaseException) -> None:
        """Keep the first failure; waiting readers wake and raise it."""
        with self._changed:
            if self._error is None:
                self._error = exc
            self._changed.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise ProgramError(f"the program failed: {self._error}") from self._error

    def close(self) -> None:
        """End the worker threads of this state and its branches, and any text iterator."""
        for child in self.children:
            child.close()
        self._ops.put(_END)
        self._pieces.put(_END)

    # ---- pieces, run on the worker -------------------------------------------------------

    def _append(self, text: str, ids: list[int] | None = None) -> None:
        self._ids += self.backend.tokenize(text) if ids is None else ids
        self._text += text
        self._pieces.put(text)

    def _set(self, name: str | None, value: Any, meta: dict) -> None:
        if name is not None:
            with self._changed:
                self._vars[name], self._meta[name] = value, meta
                self._changed.notify_all()

    def _begin_role(self, role: str) -> None:
        if self._role is not None:
            raise ProgramError(f"cannot open a {role} message inside a {self._role[0]} message")
        fmt = self.backend.chat_format
        self._append(fmt.prefixes[role] if self._ids else fmt.first_prefixes[role])
        self._role = (role, len(self._text))

    def _end_role(self) -> None:
        role, start = self._role
        self._messages.append({"role": role, "content": self._text[start:]})
        self._role = None
        self._append(self.backend.chat_format.suffixes[role])

    def _meet_siblings(self) -> None:
        if self._group is not None:
            self._group.arrive(self, list(self._ids), lambda b: b._idle())
            self._group = None

    def _gen(self, gen: Gen) -> None:
        params = gen.params(self.defaults)
        fmt = self.backend.tool_format if gen.tools else None
        if forced := gen.forced_tools:
            max_calls = 1 if gen.tool_choice != "required" else len(forced)
            params = replace(params, ebnf=fmt.grammar(forced, max_calls))
        self._meet_siblings()
        on_text = self._pieces.put if self.stream else None
        out = self.backend.generate(self._ids, params, on_text)
        meta, text = out["meta_info"], out["text"]
        matched = meta["finish_reason"]["matched"]
        if isinstance(matched, str):  # cut at a stop string: the kept text, tokenized
            ids = self.backend.tokenize(text)
        elif isinstance(matched, int):  # a stop token is not part of the text
            ids = out["token_ids"][:-1]
        else:
            ids = out["token_ids"]
        self._ids += ids
        self._text += text
        if not self.stream:
            self._pieces.put(text)
        if fmt is not None:
            calls = fmt.parse(text)[1]
            meta = {
                **meta,
                "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls],
            }
        self._set(gen.name, text, meta)

    def _select(self, sel: Select) -> None:
        choices = [self.backend.tokenize(c) for c in sel.choices]
        self._meet_siblings()
        outs = self.backend.score(self._ids, choices)
        scores = []
        for out in outs:
            logps = [lp for lp, _ in out["meta_info"]["input_token_logprobs"]]
            scores.append(sum(logps) / len(logps))
        best = max(range(len(scores)), key=scores.__getitem__)
        self._append(sel.choices[best], choices[best])
        meta = {
            "normalized_logprobs": scores,
            "prompt_tokens": [o["meta_info"]["prompt_tokens"] for o in outs],
            "cached_tokens": [o["meta_info"]["cached_tokens"] for o in outs],
        }
        self._set(sel.name, sel.choices[best], meta)


class _RoleBlock:
    """``with s.user(): s += ...``: the block's pieces form one message."""

    def __init__(self, state: ProgramState, role: str) -> None:
        self.state, self.role = state, role

    def __enter__(self) -> ProgramState:
        self.state._submit(lambda: self.state._begin_role(self.role))
        return self.state

    def __exit__(self, *exc: object) -> None:
        self.state._submit(self.state._end_role)
