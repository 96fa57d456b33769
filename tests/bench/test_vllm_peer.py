"""The vLLM peer runs in another interpreter, one JSON line per workload each way. A
stand-in ``vllm`` package (vLLM itself is never a test dependency) checks that protocol end
to end: the checkpoint directory, the block size, token prompts wave by wave, greedy
settings, an empty prefix cache at the start of each pass."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

from radixserve.bench.vllm_peer import VllmPeer
from radixserve.bench.workloads import Request, Workload

FAKE_VLLM = """
import json, os
from pathlib import Path

class SamplingParams:
    def __init__(self, max_tokens=16, temperature=1.0, ignore_eos=False):
        self.max_tokens, self.temperature, self.ignore_eos = max_tokens, temperature, ignore_eos

class _Out:
    def __init__(self, cached):
        self.num_cached_tokens = cached

class LLM:
    def __init__(self, model, enable_prefix_caching, dtype, max_model_len, block_size):
        assert Path(model, "config.json").exists() and enable_prefix_caching
        self.block, self.seen, self.log = block_size, set(), []

    def reset_prefix_cache(self):
        self.seen.clear()

    def generate(self, prompts, params, use_tqdm=True):
        outs = []
        for p, sp in zip(prompts, params if isinstance(params, list) else [params] * len(prompts)):
            ids = p["prompt_token_ids"]
            hit = 0
            for k in range(len(ids) // self.block):
                if tuple(ids[: (k + 1) * self.block]) not in self.seen:
                    break
                hit = (k + 1) * self.block
            for k in range(len(ids) // self.block):
                self.seen.add(tuple(ids[: (k + 1) * self.block]))
            self.log.append((len(ids), sp.max_tokens, sp.temperature, sp.ignore_eos))
            outs.append(_Out(hit))
        with open(os.environ["FAKE_VLLM_LOG"], "a") as f:
            f.write(json.dumps(self.log) + "\\n")
        return outs
"""


def _install(tmp_path, monkeypatch, source: str) -> None:
    """A stand-in ``vllm`` package from ``source``, on the peer's import path."""
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(source))
    (pkg / "inputs.py").write_text(
        "def TokensPrompt(prompt_token_ids):\n    return {'prompt_token_ids': prompt_token_ids}\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))


def test_the_peer_speaks_the_json_line_protocol(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    _install(tmp_path, monkeypatch, FAKE_VLLM)
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    shared = np.arange(3, 35, dtype=np.int32)
    reqs = [
        Request(np.concatenate([shared, [40 + i]]).astype(np.int32), 4, wave=i // 2)
        for i in range(4)
    ]
    work = Workload("w", "test", reqs)
    with VllmPeer(sys.executable, "tiny", page_size=16) as peer:
        rows = [peer.run(work), peer.run(work), peer.run(work, warm=True)]
    assert all(r["config"] == "vllm" and r["requests"] == 4 and r["seconds"] > 0 for r in rows)
    # cold: the first request computes the 32 shared tokens, the other three hit both
    # blocks, in each pass alike; warm: every request hits both blocks
    assert rows[0]["hit_rate"] == rows[1]["hit_rate"] == 3 * 32 / (4 * 33)
    assert rows[2]["hit_rate"] == 4 * 32 / (4 * 33)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1 + 2 + 2 + 4  # a warm-up, then one generate per wave and pass
    assert calls[-1][-1] == [33, 4, 0, True]


STUBBORN_WORKER = """
import os, subprocess, sys

SamplingParams = dict

class LLM:
    def __init__(self, *args, **kwargs):  # a worker that ignores SIGTERM, as vLLM's do
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        worker = subprocess.Popen([sys.executable, "-c", code])
        open(os.environ["FAKE_VLLM_WORKER"], "w").write(str(worker.pid))
        raise RuntimeError("the engine failed after starting its worker")
"""


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _running(pid: int) -> bool:
    # a zombie has stopped; only its parent's reaping is left
    return _state(pid) not in (None, "Z")


def test_a_failed_vllm_run_leaves_no_worker_behind(tmp_path, monkeypatch):
    pid_file = tmp_path / "worker.pid"
    _install(tmp_path, monkeypatch, STUBBORN_WORKER)
    monkeypatch.setenv("FAKE_VLLM_WORKER", str(pid_file))
    work = Workload("w", "test", [Request(np.arange(3, 10, dtype=np.int32), 2)])
    errors = []

    def run():
        try:
            VllmPeer(sys.executable, "tiny", page_size=16).run(work)
        except RuntimeError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    worker = int(pid_file.read_text())
    try:
        assert not thread.is_alive(), "the run waited on its worker"
        assert errors and "the engine failed" in errors[0]
        assert not _running(worker)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


OWNER = """
import os, sys, time
import numpy as np
from radixserve.bench.vllm_peer import VllmPeer
from radixserve.bench.workloads import Request, Workload

peer = VllmPeer(sys.executable, "tiny", page_size=16)
peer.run(Workload("w", "test", [Request(np.arange(3, 10, dtype=np.int32), 2)]))
print(peer._proc.pid, peer._tmp.name, flush=True)
time.sleep(600)
"""


def test_a_stopped_peer_dies_with_its_owner(tmp_path, monkeypatch):
    """Between passes the peer is stopped, where it cannot watch its owner; the watcher
    process kills it when the owner is killed outright."""
    _install(tmp_path, monkeypatch, FAKE_VLLM)
    monkeypatch.setenv("FAKE_VLLM_LOG", str(tmp_path / "calls.jsonl"))
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        peer, folder = owner.stdout.readline().split()
        peer = int(peer)
        deadline = time.monotonic() + 20  # the stop signal lands asynchronously
        while _state(peer) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(peer) == "T"
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 20
        while (_running(peer) or Path(folder).exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(peer)
        assert not Path(folder).exists()  # the exported model goes with it
    finally:
        owner.kill()
        owner.wait()
