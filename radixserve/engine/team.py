"""The compute thread's OpenMP team as the kernel sees it: which tasks belong to it, and how
long they have waited for a CPU.

The compute thread names itself (``prctl``); the OpenMP workers it starts inherit the name,
so the team is every task of this process with that name. Linux counts, per task, the time
it was runnable but not running (the second field of ``/proc/<pid>/task/<tid>/schedstat``):
a team that waits hardly at all owns its CPUs; one whose threads wait as long as they run
shares them with someone else. Where any of this is missing, ``TeamClock.open`` is None.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time

TEAM_NAME = "rs-compute"  # at most 15 bytes: the kernel's limit for a task's name
_PR_SET_NAME = 15
_TASKS = "/proc/self/task"


class TeamClock:
    """Sums the run-queue waits of the tasks named ``name``."""

    def __init__(self, name: str = TEAM_NAME) -> None:
        self.name = name
        self._tids: list[str] = []
        self._tasks: list[str] = []
        self.refresh()

    @classmethod
    def open(cls, name: str = TEAM_NAME) -> TeamClock | None:
        """A clock for the calling thread's team, after naming the thread ``name``; None where
        the kernel does not say (not Linux, no schedstat)."""
        if not os.path.exists("/proc/thread-self/schedstat"):
            return None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            if libc.prctl(_PR_SET_NAME, name.encode(), 0, 0, 0) != 0:
                return None
            clock = cls(name)
        except (OSError, AttributeError, TypeError):
            return None
        return clock if clock._tids else None

    def refresh(self) -> None:
        """Find the team's tasks again if this process's tasks changed (libgomp starts its
        workers at the first parallel region, and more when the team grows)."""
        tasks = os.listdir(_TASKS)
        if tasks == self._tasks:
            return
        self._tasks = tasks
        tids = []
        for tid in tasks:
            try:
                with open(f"{_TASKS}/{tid}/comm") as f:
                    if f.read().strip() == self.name:
                        tids.append(tid)
            except OSError:  # the task ended while we looked
                continue
        self._tids = tids

    def waited_ns(self) -> int:
        """Nanoseconds the team's tasks as they are now have spent runnable but not running,
        in all (a worker started between two readings adds its few waits to the second)."""
        self.refresh()
        total = 0
        for tid in self._tids:
            try:
                with open(f"{_TASKS}/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue
        return total


def probe_team(clock: TeamClock, threads: int, seconds: float) -> float:
    """Run parallel regions on ``threads`` threads for about ``seconds``; how many of them
    waited for a CPU on average (0 when the team ran whole). The calling thread's thread
    count is restored after."""
    import torch  # here: importing this module must not load torch (``openmp.py``)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(threads * 32768)  # one 32k-element grain per thread: a region each op
        torch.exp(x, out=x)  # starts any worker the team lacks, so the clock can see it
        start, waited = time.perf_counter(), clock.waited_ns()
        while (elapsed := time.perf_counter() - start) < seconds:
            torch.exp(x.zero_(), out=x)
        return (clock.waited_ns() - waited) / 1e9 / elapsed
    finally:
        torch.set_num_threads(before)
