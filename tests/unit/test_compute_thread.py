"""Every engine's model work runs on one thread per process (one OpenMP team)."""

import os
import threading
import time

import pytest
import torch

from radixserve import Engine, SamplingParams
from radixserve.engine import compute_thread
from radixserve.engine.runner import model_runner


def test_calls_from_any_thread_run_on_one_thread_and_keep_their_errors():
    idents = []

    def where() -> int:
        idents.append(threading.get_ident())
        return len(idents)

    callers = [threading.Thread(target=compute_thread.call, args=(where,)) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(idents) == 4 and len(set(idents)) == 1 and idents[0] != threading.get_ident()
    # a call made from the compute thread itself runs inline instead of waiting on itself
    assert compute_thread.call(lambda: compute_thread.call(threading.get_ident)) == idents[0]
    with pytest.raises(ZeroDivisionError):
        compute_thread.call(lambda: 1 / 0)


def test_two_engines_run_their_forwards_on_the_same_thread(monkeypatch):
    idents = set()
    forward = model_runner.ModelRunner.forward

    def recording(self, batch):
        idents.add(threading.get_ident())
        return forward(self, batch)

    monkeypatch.setattr(model_runner.ModelRunner, "forward", recording)
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    with Engine("tiny") as a, Engine("tiny") as b:
        a.generate(input_ids=[[5, 6, 7]], sampling_params=params)
        b.generate(input_ids=[[8, 9]], sampling_params=params)
        assert a._thread is not b._thread  # each still schedules on its own thread
    assert len(idents) == 1


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def test_a_callers_own_openmp_team_is_freed_when_it_submits():
    """A caller that ran a parallel torch op holds an OpenMP team (its workers are threads of
    the process); submitting work frees it, so the compute thread's team is the only one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with Engine("tiny") as engine:
            params = SamplingParams(max_new_tokens=2, ignore_eos=True)
            engine.generate(input_ids=[1, 2, 3], sampling_params=params)  # threads started
            seen: dict[str, set[str]] = {}

            def caller() -> None:
                before = _threads()
                torch.zeros(10_000_000).add_(1)  # a parallel region: this thread's team
                seen["workers"] = _threads() - before
                engine.generate(input_ids=[4, 5, 6], sampling_params=params)
                deadline = time.monotonic() + 5
                while seen["workers"] & _threads() and time.monotonic() < deadline:
                    time.sleep(0.01)
                seen["left"] = seen["workers"] & _threads()

            t = threading.Thread(target=caller)
            t.start()
            t.join()
    finally:
        torch.set_num_threads(threads)
    assert seen["workers"], "the parallel op started no OpenMP workers"
    assert not seen["left"]
