"""The native module: the matcher against its Python twin, and the clean fallback when the
kernels cannot be built."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.cache import RadixCache
from radixserve.cpu.native import build_directory, load_native, native_available
from radixserve.memory import KVSlotAllocator

from .tree_utils import alloc_and_insert

needs_native = pytest.mark.skipif(not native_available(), reason="native kernels did not build")


@needs_native
@settings(max_examples=200, deadline=None)
@given(
    edge=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    key=st.lists(st.integers(0, 3), max_size=40),
    pos=st.integers(0, 8),
    page=st.sampled_from([1, 2, 4]),
)
def test_native_matcher_equals_python(edge, key, pos, page):
    edge_b = np.asarray(edge[: len(edge) - len(edge) % page] or [0] * page, np.int32).tobytes()
    key_b = np.asarray(key, np.int32).tobytes()
    pos = min(pos, len(key)) * 4
    got = load_native().matching_prefix(key_b, pos, edge_b, page * 4)
    n = 0
    while pos + n + page * 4 <= len(key_b) and n + page * 4 <= len(edge_b):
        if key_b[pos + n : pos + n + page * 4] != edge_b[n : n + page * 4]:
            break
        n += page * 4
    assert got == n


@needs_native
@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=30), max_size=8),
    queries=st.lists(st.lists(st.integers(0, 2), max_size=30), min_size=1, max_size=4),
    page=st.sampled_from([1, 2, 4]),
)
def test_tree_answers_alike_with_either_matcher(prompts, queries, page):
    caches = [
        RadixCache(page, KVSlotAllocator(1024 * page, page), matcher=matcher)
        for matcher in (load_native(), None)
    ]
    for cache in caches:
        for p in prompts:
            alloc_and_insert(cache, p)
    for q in queries:
        a, b = (c.match_prefix(q) for c in caches)
        assert a.length == b.length
        assert np.array_equal(a.slots, b.slots)
    assert caches[0].pretty_print() == caches[1].pretty_print()


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


PROBE = """
import logging; logging.basicConfig(level=logging.INFO)
from radixserve.attention import resolve_backend_name
from radixserve.cache import RadixCache
from radixserve.cpu.native import load_native
assert load_native() is None
assert resolve_backend_name("auto", "cpu") == "torch"
cache = RadixCache(1)
assert cache.match_prefix([1, 2, 3]).length == 0
print("fell back")
"""


def test_disabled_native_falls_back_to_torch():
    result = run_python(PROBE, RADIXSERVE_NATIVE="0")
    assert result.returncode == 0, result.stderr
    assert "fell back" in result.stdout
    assert result.stderr.count("native kernels disabled") == 1


def test_a_failed_build_falls_back_with_one_log_line(tmp_path):
    result = run_python(
        PROBE, CXX=str(tmp_path / "no-such-compiler"), TORCH_EXTENSIONS_DIR=str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert "fell back" in result.stdout
    assert result.stderr.count("native kernels unavailable") == 1


@needs_native
def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_load():
    """torch's loader waits for its lock file to go; a build killed mid-way leaves it, and
    every later start hung on it before ``_sole_builder``."""
    lock = build_directory() / "lock"
    lock.touch()
    try:
        code = "from radixserve.cpu.native import load_native; assert load_native() is not None"
        subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
        assert not lock.exists()
    finally:
        lock.unlink(missing_ok=True)
