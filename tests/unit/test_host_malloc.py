"""Freed host memory is reused: repeated large temporaries stop faulting in fresh pages."""

import platform
import resource

import pytest
import torch

from radixserve.memory.host_malloc import keep_freed_memory

PAGE = resource.getpagesize()


def _faults_for(cycles: int, numel: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(cycles):
        torch.empty(numel, dtype=torch.float32).fill_(1.0)  # allocate, touch every page, free
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt"
)
def test_a_12_mb_temporary_reuses_its_pages_after_tuning():
    assert keep_freed_memory()
    numel = 3 << 20  # 12 MB: a 2,048-token MLP activation of bench-135m
    _faults_for(20, numel)  # the heap grows to hold it
    pages = numel * 4 // PAGE
    # untuned, each cycle maps and faults in all of its ~3,000 pages again
    assert _faults_for(20, numel) < pages
