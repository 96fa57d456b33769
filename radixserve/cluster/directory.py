"""Where replicas report themselves: each replica's latest summary (its cache stats, load
and digest size), so the front door can list replicas, aggregate their metrics and address
one of them. A replica that stops reporting drops out after ``max_age_s``."""

from __future__ import annotations

import time

import ray


@ray.remote(num_cpus=0)
class Directory:
    def __init__(self) -> None:
        self._replicas: dict[str, tuple[float, dict]] = {}

    def report(self, replica: str, summary: dict) -> None:
        self._replicas[replica] = (time.monotonic(), summary)

    def replicas(self, max_age_s: float = 5.0) -> dict[str, dict]:
        now = time.monotonic()
        self._replicas = {r: v for r, v in self._replicas.items() if now - v[0] <= max_age_s}
        return {r: summary for r, (_, summary) in self._replicas.items()}
