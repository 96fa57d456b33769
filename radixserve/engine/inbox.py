"""The engine's command inbox: callers on any thread post commands, the loop thread takes
them between steps, so no lock is held while the model runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class Inbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._commands: list[Callable[[], None]] = []
        self.closed = False

    def post(self, command: Callable[[], None]) -> None:
        """Queue ``command`` for the loop; ``RuntimeError`` once the engine is shut down."""
        with self._cond:
            if self.closed:
                raise RuntimeError("the engine is shut down")
            self._commands.append(command)
            self._cond.notify()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the loop thread between steps and return its result (or raise)."""
        done: Future = Future()

        def command() -> None:
            try:
                done.set_result(fn())
            except Exception as exc:  # handed to the caller
                done.set_exception(exc)

        self.post(command)
        return done.result()

    def take(self, busy: Callable[[], bool]) -> list[Callable[[], None]] | None:
        """The commands posted since the last take, waiting until there are some or
        ``busy()``; None once closed (what was still queued is dropped)."""
        with self._cond:
            while not self._commands and not busy() and not self.closed:
                self._cond.wait()
            if self.closed:
                return None
            commands, self._commands = self._commands, []
            return commands

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify()
