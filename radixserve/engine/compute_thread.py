"""One thread per process runs every engine's model work (building it, each step).

torch's CPU kernels run on an OpenMP team that belongs to the thread calling them, and the
team stays alive as long as that thread does. With two live teams on a 2-core machine,
libgomp manages more threads than there are CPUs and throttles its spin-waiting, so every
parallel region wakes its workers through the kernel, and a second, idle engine slowed a
busy one down by a large fraction (``docs/performance.md``). Routing all model
work through one thread keeps one team; engines in one process then take turns step by
step, as they would for the CPU anyway. Between jobs the thread's ``ThreadGovernor`` sizes
the team to the CPUs it can have (``thread_governor.py``).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from radixserve.engine.team import TeamClock, probe_team
from radixserve.engine.thread_governor import GovernorConfig, ThreadGovernor, adapting

T = TypeVar("T")
logger = logging.getLogger(__name__)

_lock = threading.Lock()
_jobs: queue.SimpleQueue[tuple[Callable[[], object], Future] | None] | None = None
_thread: threading.Thread | None = None
governor: ThreadGovernor | None = None  # the compute thread's, once it runs (None: fixed count)
_fixed_team = 0  # the thread count, where no governor changes it


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


def team_size() -> int:
    """The threads the compute thread's parallel regions use now (0 before it has run)."""
    return governor.threads if governor is not None else _fixed_team


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
    global governor
    governor = _governor()
    while (job := jobs.get()) is not None:
        fn, done = job
        _govern(ThreadGovernor.before_job)
        try:
            done.set_result(fn())
        except BaseException as exc:  # handed to the caller, which raises it
            done.set_exception(exc)
        _govern(ThreadGovernor.after_job)


def _govern(turn: Callable[[ThreadGovernor], None]) -> None:
    """The governor's turn between jobs; should it fail, the count stays as it is and the
    thread goes on serving jobs."""
    global governor, _fixed_team
    if governor is None:
        return
    try:
        turn(governor)
    except Exception:
        logger.exception("the thread governor failed; the thread count stays %d", governor.threads)
        governor, _fixed_team = None, governor.threads


def _governor() -> ThreadGovernor | None:
    """The compute thread's governor, where the kernel reports the team's waits and the count
    may adapt; on the compute thread, which names itself for the team's workers to inherit."""
    global _fixed_team
    import torch

    if not adapting() or (clock := TeamClock.open()) is None:
        _fixed_team = torch.get_num_threads()
        return None
    config = GovernorConfig()
    return ThreadGovernor(
        torch.get_num_threads(),
        clock.waited_ns,
        torch.set_num_threads,
        lambda threads: probe_team(clock, threads, config.probe_s),
        config,
    )


def _stop() -> None:
    """At exit, after the engines (registered later, so stopped first): a daemon thread
    still inside a native op when the interpreter finalizes would abort the process."""
    with _lock:
        if _thread is not None and _thread.is_alive() and _jobs is not None:
            _jobs.put(None)
            _thread.join()
