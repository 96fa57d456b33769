"""How many threads the compute thread's parallel regions use, decided while it runs.

A decode step is ~150 parallel regions, each over when the slowest thread of the team is. When
another process wants a core (a build, a browser tab, an indexer), one of the team waits
behind it at every region and a step takes up to 70x as long as alone: ``nice`` does not
help a neighbour started in another login session, since the kernel first shares the CPUs
between sessions. The team's own time waiting for a CPU says so (``team.py``); alone it
hardly waits. The governor then drops the threads that cannot run, and at growing intervals
tries one more for a few milliseconds, so the team grows back once the CPU is free again.
``RADIXSERVE_ADAPT_THREADS=0`` keeps the count torch started with.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

DISABLE_ENV = "RADIXSERVE_ADAPT_THREADS"


@dataclass(frozen=True)
class GovernorConfig:
    window_s: float = 0.2  # wall time over which the team's waiting is judged
    # threads' worth of waiting, summed over the team, from which it counts as crowded: alone
    # a team waits a few tenths (the process's other threads); a neighbour makes it one or more
    crowded: float = 0.5
    first_probe_s: float = 1.0  # from a drop to the first try of one more thread
    max_probe_s: float = 16.0  # the longest interval between tries (doubling up to it)
    probe_s: float = 0.02  # how long a try runs (shorter ones misjudge now and then)

    def __post_init__(self) -> None:
        if self.crowded <= 0:
            raise ValueError(
                f"crowded must be positive (threads' worth of waiting), got {self.crowded}"
            )
        if not 0 < self.first_probe_s <= self.max_probe_s:
            raise ValueError("first_probe_s must be positive and at most max_probe_s")


class ThreadGovernor:
    """Sizes the team from its waits. ``waited_ns()`` is the team's total run-queue wait so far;
    ``set_threads(n)`` resizes it; ``probe(n)`` runs ``n`` threads briefly and returns how
    many waited on average. All are called on the compute thread, between jobs."""

    def __init__(
        self,
        max_threads: int,
        waited_ns: Callable[[], int],
        set_threads: Callable[[int], None],
        probe: Callable[[int], float],
        config: GovernorConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_threads = max_threads
        self.threads = max_threads
        self.config = config or GovernorConfig()
        self._waited_ns, self._set, self._probe, self._clock = waited_ns, set_threads, probe, clock
        self._window: tuple[float, int] | None = None  # (start, waited_ns) of the open window
        self._backoff = self.config.first_probe_s
        self._next_probe = 0.0
        self._raised_at: float | None = None  # when a probe last added a thread

    def before_job(self) -> None:
        """Try one more thread if it is time, then open a window if none is open."""
        now = self._clock()
        if self.threads < self.max_threads and now >= self._next_probe:
            self._try_more(now)
        if self._window is None:
            self._window = (self._clock(), self._waited_ns())

    def after_job(self) -> None:
        """Close the window once it is long enough; drop threads if the team was crowded."""
        if self._window is None:
            return
        now = self._clock()
        start, waited = self._window
        if now - start < self.config.window_s:
            return
        self._window = None
        waiting = (self._waited_ns() - waited) / 1e9 / (now - start)
        if self.threads > 1 and waiting >= self.config.crowded:
            fewer = max(1, self.threads - max(1, round(waiting)))
            # A thread a probe just added that crowds the team at once: wait longer next time.
            recent = self._raised_at is not None and now - self._raised_at < 4 * self._backoff
            doubled = min(2 * self._backoff, self.config.max_probe_s)
            self._backoff = doubled if recent else self.config.first_probe_s
            self._raised_at = None
            logger.info(
                "compute threads %d -> %d: %.1f of them waited for a CPU (another process is "
                "busy); trying %d again in %.0f s",
                self.threads, fewer, waiting, self.threads, self._backoff,
            )  # fmt: skip
            self._resize(fewer, now)

    def _try_more(self, now: float) -> None:
        more = self.threads + 1
        waiting = self._probe(more)
        if waiting < self.config.crowded:
            logger.info("compute threads %d -> %d: the CPU is free again", self.threads, more)
            self._raised_at = now
            self._resize(more, now)
        else:
            self._backoff = min(2 * self._backoff, self.config.max_probe_s)
            self._next_probe = now + self._backoff

    def _resize(self, threads: int, now: float) -> None:
        self.threads = threads
        self._set(threads)
        self._window = None
        self._next_probe = now + self._backoff


def adapting() -> bool:
    """Whether the thread count may change (``RADIXSERVE_ADAPT_THREADS`` is not 0)."""
    return os.environ.get(DISABLE_ENV, "1") != "0"
