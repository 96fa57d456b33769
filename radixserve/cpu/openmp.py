"""The OpenMP waiting policy the command line (and a cluster's replicas) start torch with.

libgomp reads these once, when torch loads it (the commands import torch after main starts).
Between parallel regions an OpenMP team's workers spin before they sleep, but while the
process holds more OpenMP threads than cores (a second thread that ran one parallel torch
op holds a team of its own) libgomp cuts that spin to 100 turns, and each of a decode
step's regions then waits for its worker to be woken by the kernel. Active waiting makes
the cut spin 1,000 turns; GOMP_SPINCOUNT keeps the usual spin at libgomp's default (active
alone would spin without end).

Nothing here imports torch: it must run before torch loads.
"""

from __future__ import annotations

from collections.abc import MutableMapping

OPENMP_ENV = {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "300000"}


def openmp_defaults(env: MutableMapping[str, str]) -> None:
    """``OPENMP_ENV`` into ``env`` unless the user set either variable."""
    if not any(name in env for name in OPENMP_ENV):
        env.update(OPENMP_ENV)
