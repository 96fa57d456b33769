"""The branches of one ``fork`` meet at their first model call, so the context they share is
computed once: the fork point plus whatever every branch added since (typically a role
header, which alone is too short for the engine's in-batch sharing to wait for)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

# How long the first branch waits for siblings still running pieces before their first call.
MAX_GATHER_S = 0.5
_POLL_S = 0.002


class ForkGroup:
    def __init__(self, cache_prefix: Callable[[Sequence[int]], object]) -> None:
        self.cache_prefix = cache_prefix
        self.members: list[object] = []  # the branch states
        self.arrived: dict[int, list[int]] = {}  # id(branch) -> its ids at its first call
        self.phase = "gathering"  # then "prefilling", then "done"
        self.cond = threading.Condition()

    def arrive(self, branch, ids: list[int], is_idle: Callable[[object], bool]) -> None:
        """Called by a branch's worker before its first model call; returns once the shared
        context is cached (or at once after the group is done)."""
        with self.cond:
            if self.phase == "done":
                return
            self.arrived[id(branch)] = ids
            self.cond.notify_all()
            deadline = time.monotonic() + MAX_GATHER_S
            # Siblings with nothing queued will not call soon: the group goes without them.
            while self.phase == "gathering" and time.monotonic() < deadline:
                if all(id(m) in self.arrived or is_idle(m) for m in self.members):
                    break
                self.cond.wait(_POLL_S)
            if self.phase != "gathering":
                self.cond.wait_for(lambda: self.phase == "done")
                return
            self.phase = "prefilling"
            shared = _common_prefix(list(self.arrived.values()))
            worth_it = len(self.arrived) > 1
        try:
            if worth_it and shared:
                self.cache_prefix(shared)
        finally:
            with self.cond:
                self.phase = "done"
                self.cond.notify_all()


def _common_prefix(seqs: list[list[int]]) -> list[int]:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return first[:n]
