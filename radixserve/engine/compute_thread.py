"""One thread per process runs every engine's model work (building it, each step).

torch's CPU kernels run on an OpenMP team that belongs to the thread calling them, and the
team stays alive as long as that thread does. With two live teams on a 2-core machine,
libgomp manages more threads than there are CPUs and throttles its spin-waiting, so every
parallel region wakes its workers through the kernel, and a second, idle engine slowed a
busy one down by a large fraction (``docs/performance.md``). Routing all model
work through one thread keeps one team; engines in one process then take turns step by
step, as they would for the CPU anyway.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_jobs: queue.SimpleQueue[tuple[Callable[[], object], Future] | None] | None = None
_thread: threading.Thread | None = None


def call(fn: Callable[[], T]) -> T:
    """``fn()`` run on the compute thread (started on first use); its result or its
    exception. Inline when called from that thread, or once it has stopped at exit."""
    if threading.current_thread() is _thread:
        return fn()
    jobs = _start()
    if jobs is None:
        return fn()
    done: Future = Future()
    jobs.put((fn, done))
    return done.result()


def release_caller_team() -> None:
    """Free the calling thread's OpenMP team, if it has one, while it waits on the compute
    thread. A program's own parallel torch op (on its main thread, say) leaves that thread a
    team for good, and then the compute thread's team is throttled as above; freed, the
    team's workers exit, and the thread's next parallel op starts a new one. libgomp only
    (torch's build on Linux); elsewhere nothing happens."""
    if threading.current_thread() is _thread:
        return
    if (gomp := _libgomp()) is not None:
        gomp.omp_pause_resource_all(1)  # omp_pause_soft; refused inside a parallel region


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """The libgomp that torch loaded (an engine's callers have torch loaded), if it can pause
    (OpenMP 5.0)."""
    try:
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps if "/libgomp" in line), None)
        lib = None if path is None else ctypes.CDLL(path)
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "omp_pause_resource_all") else None


def _start() -> queue.SimpleQueue | None:
    global _jobs, _thread
    with _lock:
        if _thread is None:
            _jobs = queue.SimpleQueue()
            _thread = threading.Thread(
                target=_serve, args=(_jobs,), name="radixserve-compute", daemon=True
            )
            _thread.start()
            atexit.register(_stop)
        return _jobs if _thread.is_alive() else None


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        fn, done = job
        try:
            done.set_result(fn())
        except BaseException as exc:  # handed to the caller, which raises it
            done.set_exception(exc)


def _stop() -> None:
    """At exit, after the engines (registered later, so stopped first): a daemon thread
    still inside a native op when the interpreter finalizes would abort the process."""
    with _lock:
        if _thread is not None and _thread.is_alive() and _jobs is not None:
            _jobs.put(None)
            _thread.join()
