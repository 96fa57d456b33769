"""``@function``: a Python function over a program state, run once or over a batch."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixserve.lang.backend import BaseBackend, as_backend
from radixserve.lang.primitives import GEN_FIELDS
from radixserve.lang.state import ProgramError, ProgramState

_default_backend: BaseBackend | None = None
_default_lock = threading.Lock()


def set_default_backend(backend) -> None:
    """The backend programs use when ``run`` is not given one (an Engine or RuntimeEndpoint)."""
    global _default_backend
    with _default_lock:
        _default_backend = as_backend(backend)


def _resolve(backend) -> BaseBackend:
    if backend is not None:
        return as_backend(backend)
    if _default_backend is None:
        raise ValueError("no backend: pass backend= or call set_default_backend first")
    return _default_backend


class Program:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.arg_names = set(inspect.signature(fn).parameters)
        functools.update_wrapper(self, fn)

    def __call__(self, s: ProgramState, *args, **kwargs) -> Any:
        """Run inside another program, on its state."""
        return self.fn(s, *args, **kwargs)

    def _split(self, kwargs: dict) -> tuple[dict, dict]:
        """Program arguments, and sampling defaults for its gens (names the program lacks)."""
        args, defaults = {}, {}
        for key, value in kwargs.items():
            name = "max_new_tokens" if key == "max_tokens" else key
            if key not in self.arg_names and name in GEN_FIELDS:
                defaults[name] = value
            else:
                args[key] = value
        return args, defaults

    def _start(self, backend, stream: bool, kwargs: dict) -> tuple[ProgramState, dict]:
        args, defaults = self._split(kwargs)
        return ProgramState(_resolve(backend), defaults, stream), args

    def _execute(self, state: ProgramState, args: dict) -> ProgramState:
        """Run the function, wait for every branch, record the first failure; never raises."""
        try:
            self.fn(state, **args)
            _sync_tree(state)
        except Exception as exc:
            state.record_error(exc)
        finally:
            state.close()
        return state

    def run(self, *, backend=None, stream: bool = False, **kwargs) -> ProgramState:
        """Run once. With ``stream=True`` this returns at once and the program runs on;
        read it with ``state.text_iter()``. Otherwise a failure is raised here."""
        state, args = self._start(backend, stream, kwargs)
        if stream:
            threading.Thread(target=self._execute, args=(state, args), daemon=True).start()
            return state
        self._execute(state, args)
        if (error := state.error()) is not None:
            raise error
        return state

    def run_batch(
        self,
        batch_kwargs: Sequence[dict],
        *,
        backend=None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        **defaults,
    ) -> list[ProgramState]:
        """Run the program once per kwargs dict, side by side; a failed program's state
        carries its error and the others go on."""
        threads = min(64, max(1, len(batch_kwargs))) if num_threads == "auto" else num_threads
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"num_threads must be 'auto' or a positive int, got {num_threads!r}")
        starts = [self._start(backend, False, {**defaults, **kw}) for kw in batch_kwargs]
        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(self._execute, state, args) for state, args in starts]
            if progress_bar:
                _show_progress(futures)
            return [f.result() for f in futures]


def _sync_tree(state: ProgramState) -> None:
    state.sync()
    for child in state.children:
        _sync_tree(child)
        if state.error() is None and child.error() is not None:
            state.record_error(ProgramError(f"a forked branch failed: {child.error()}"))


def _show_progress(futures: list) -> None:
    from concurrent.futures import as_completed

    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task("programs", total=len(futures))
        for _ in as_completed(futures):
            progress.advance(task)


def function(fn: Callable[..., Any]) -> Program:
    """Make ``fn(s, ...)`` a program: ``fn.run(...)`` and ``fn.run_batch([...])``."""
    return Program(fn)
