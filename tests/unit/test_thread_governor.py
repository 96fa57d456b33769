"""The compute thread's team shrinks while another process keeps a core busy and grows back
when it stops: the governor's decisions on recorded waits, and the whole loop against real
neighbours (spinning processes in their own sessions, where ``nice`` would not help us)."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from radixserve.engine import compute_thread
from radixserve.engine.team import TeamClock, probe_team
from radixserve.engine.thread_governor import GovernorConfig, ThreadGovernor

CONFIG = GovernorConfig(window_s=0.2, crowded=0.5, first_probe_s=1.0, max_probe_s=8.0)


class Recorded:
    """A fake clock and team: each job lasts ``job_s``; the team waits ``waiting`` threads'
    worth of it (a function of the team size, like a machine with a neighbour on it)."""

    def __init__(self, threads: int, waiting) -> None:
        self.now, self.waited, self.waiting = 0.0, 0, waiting
        self.probes: list[tuple[float, int]] = []
        self.governor = ThreadGovernor(
            threads, lambda: self.waited, lambda n: None, self.probe, CONFIG, lambda: self.now
        )

    def probe(self, threads: int) -> float:
        self.probes.append((self.now, threads))
        return self.waiting(threads)

    def run(self, seconds: float, job_s: float = 0.05) -> None:
        end = self.now + seconds
        while self.now < end:
            self.governor.before_job()
            self.now += job_s
            self.waited += int(self.waiting(self.governor.threads) * job_s * 1e9)
            self.governor.after_job()


def neighbour(cores: int):
    """With a neighbour on each core, a team of ``n`` waits about ``n / 2`` threads' worth."""
    return lambda n: n / 2 if cores else 0.02 * n


def test_the_team_keeps_its_threads_when_it_hardly_waits():
    rec = Recorded(4, lambda n: 0.8 * CONFIG.crowded)  # the process's other threads
    rec.run(30)
    assert rec.governor.threads == 4 and rec.probes == []


def test_a_crowded_team_drops_the_waiting_threads_then_probes_less_and_less_often():
    rec = Recorded(2, neighbour(2))
    rec.run(0.3)
    assert rec.governor.threads == 1  # one window was enough
    rec.run(30)
    assert rec.governor.threads == 1
    gaps = [b[0] - a[0] for a, b in zip(rec.probes, rec.probes[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[0] <= 2.1 and 7.9 < gaps[-1] <= 8.1
    assert {t for _, t in rec.probes} == {2}


def test_the_team_grows_back_once_the_neighbour_is_gone():
    busy = {"cores": 2}
    rec = Recorded(2, lambda n: neighbour(busy["cores"])(n))
    rec.run(20)
    assert rec.governor.threads == 1
    busy["cores"] = 0
    gone = rec.now
    rec.run(10)
    assert rec.governor.threads == 2
    assert rec.probes[-1][0] - gone <= CONFIG.max_probe_s + 0.1


def test_a_thread_that_crowds_the_team_right_after_a_probe_doubles_the_wait():
    # The probe finds room (a short try), the steps then do not: the next try comes later.
    rec = Recorded(2, lambda n: 1.0 if n == 2 else 0.0)
    rec.probe = lambda n: rec.probes.append((rec.now, n)) or 0.0
    rec.run(0.3)
    rec.run(30)
    gaps = [b[0] - a[0] for a, b in zip(rec.probes, rec.probes[1:], strict=False)]
    assert len(gaps) >= 3 and gaps[-1] > 2 * gaps[0]


def test_a_big_team_drops_as_many_threads_as_waited():
    # four neighbours on 16 cores: each shares a core with one of the team
    rec = Recorded(16, lambda n: max(0.0, n - 12) * 0.5 + 0.01 * n)
    rec.run(0.3)
    assert rec.governor.threads == 14  # two threads' worth waited
    rec.run(1.0)
    assert rec.governor.threads == 12  # then one more each window while any still waited


def test_config_is_checked():
    with pytest.raises(ValueError, match="crowded"):
        GovernorConfig(crowded=0)
    with pytest.raises(ValueError, match="first_probe_s"):
        GovernorConfig(first_probe_s=10, max_probe_s=1)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: the team has one thread")
def test_real_neighbours_shrink_the_team_and_their_end_grows_it_back():
    cores = min(os.cpu_count() or 1, 4)
    result: dict = {}

    def team() -> None:
        torch.set_num_threads(cores)
        clock = TeamClock.open("rs-test-team")
        assert clock is not None, "Linux says how long a task waited for a CPU"
        config = GovernorConfig(first_probe_s=0.2, max_probe_s=1.0)
        gov = ThreadGovernor(
            cores,
            clock.waited_ns,
            torch.set_num_threads,
            lambda n: probe_team(clock, n, config.probe_s),
            config,
        )
        x = torch.ones(cores * 65536)

        def jobs_until(done, limit_s: float) -> float:
            start = time.monotonic()
            while not done() and time.monotonic() - start < limit_s:
                gov.before_job()
                for _ in range(20):  # a step's worth of parallel regions
                    torch.exp(x.zero_(), out=x)
                gov.after_job()
            return time.monotonic() - start

        spinners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(cores)
        ]
        try:
            result["shrunk_after_s"] = jobs_until(lambda: gov.threads < cores, 20)
            result["shrunk_to"] = gov.threads
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        result["grown_after_s"] = jobs_until(lambda: gov.threads == cores, 20)
        result["grown_to"] = gov.threads

    worker = threading.Thread(target=team)  # a team of its own, apart from the engine's
    worker.start()
    worker.join()
    assert result["shrunk_to"] < cores and result["shrunk_after_s"] < 20, result
    assert result["grown_to"] == cores and result["grown_after_s"] < 20, result


def test_the_engines_compute_thread_is_governed():
    compute_thread.call(lambda: None)
    assert compute_thread.governor is not None
    assert compute_thread.team_size() == compute_thread.governor.threads >= 1


def test_the_benchmarks_neighbour_spins_in_its_own_session_and_ends_with_the_block():
    from radixserve.bench.common import busy_neighbour

    before = _children()
    with busy_neighbour():
        (pid,) = _children() - before
        deadline = time.monotonic() + 10
        while (stat := _stat(pid))[16] != "19" and time.monotonic() < deadline:
            time.sleep(0.01)  # ``nice`` lowers the priority, then starts the spinner
        assert int(stat[3]) == pid != os.getsid(0) and stat[16] == "19"  # session, nice
    assert _children() == before


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the name."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _children() -> set[int]:
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
        return {int(p) for p in f.read().split()}
