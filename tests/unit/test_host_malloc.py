"""Freed host memory is reused: repeated large temporaries stop faulting in fresh pages."""

import platform
import resource
import subprocess
import sys
import textwrap

import pytest
import torch

from radixserve.memory.host_malloc import keep_freed_memory

PAGE = resource.getpagesize()


def _faults_for(cycles: int, numel: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(cycles):
        torch.empty(numel, dtype=torch.float32).fill_(1.0)  # allocate, touch every page, free
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt"
)


@glibc_only
def test_a_12_mb_temporary_reuses_its_pages_after_tuning():
    assert keep_freed_memory()
    numel = 3 << 20  # 12 MB: a 2,048-token MLP activation of bench-135m
    _faults_for(20, numel)  # the heap grows to hold it
    pages = numel * 4 // PAGE
    # untuned, each cycle maps and faults in all of its ~3,000 pages again
    assert _faults_for(20, numel) < pages


# In a fresh process: a thread holding 150 MB (a KV pool, weights) and cycling a 12 MB
# temporary, as the engine's compute thread does. Untuned, the thread's own arena unmaps the
# heap the temporary emptied and every cycle faults its ~3,000 pages in again.
_THREAD_CYCLES = textwrap.dedent("""
    import resource, threading, torch
    from radixserve.memory.host_malloc import keep_freed_memory
    assert keep_freed_memory()
    def faults(cycles):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(cycles):
            torch.empty(3 << 20).fill_(1.0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    out = []
    def work():
        held = [torch.ones(3 << 20) for _ in range(12)]
        faults(40)
        out.append(faults(20))
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    print(out[0])
""")


@glibc_only
def test_a_thread_started_after_tuning_reuses_its_pages():
    run = subprocess.run(
        [sys.executable, "-c", _THREAD_CYCLES], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.strip()) < (3 << 20) * 4 // PAGE
