"""vLLM (with automatic prefix caching) on serving workloads, in its own interpreter.

vLLM lives in a virtual environment of its own (see ``docs/peers.md``), never as a
dependency of radixserve. ``VllmPeer`` runs this file with that environment's Python once
per benchmark run, like a server that stays up: a workload goes in as one JSON line on its
stdin, its timings come back as one JSON line. Each pass starts from an empty prefix cache.
Run as a script, the file imports only vLLM and the standard library (and, as ``--watch``,
only the standard library).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class VllmPeer:
    """One vLLM process for a whole run, stopped (SIGSTOP) between its passes. Started per
    round, each of its exits left the next seconds of this VM slow (steal time); left
    running, its idle threads (a worker polling for a second after each pass, gloo's loops
    waking hundreds of times a second) preempt the other engine's two threads. Stopped, it
    takes no CPU at all while the other side runs; a watcher process outside its group
    kills it if this process dies, since a stopped process notices nothing itself."""

    def __init__(self, python: str, model: str, page_size: int, dtype: str = "float32"):
        from radixserve.engine import compute_thread
        from radixserve.model.presets import PRESETS, export_preset

        self._tmp = tempfile.TemporaryDirectory(prefix="radixserve-vllm-")
        self._proc: subprocess.Popen | None = None
        self._watcher: subprocess.Popen | None = None
        self._log = Path(self._tmp.name) / "stderr.txt"
        try:
            # built on the engines' compute thread: torch work on this thread would start a
            # second OpenMP team, which slows every engine of this process (compute_thread.py)
            model_dir = (
                str(compute_thread.call(lambda: export_preset(model, Path(self._tmp.name) / "m")))
                if model in PRESETS
                else model
            )
            setup = {
                "model_dir": model_dir,
                "block_size": -(-page_size // 32) * 32,  # its CPU attention wants 32s
                "dtype": dtype,
            }
            env = {
                **os.environ,
                "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                "VLLM_CPU_KVCACHE_SPACE": "4",
            }
            # its own process group, so that vLLM's workers go with it whatever happens
            # here; its log in a file, which a worker still holding it cannot keep open
            with self._log.open("w") as err:
                self._proc = subprocess.Popen(
                    [python, __file__, json.dumps(setup)],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    start_new_session=True,
                )
            self._watcher = subprocess.Popen(
                [sys.executable, __file__, "--watch", str(os.getpid()), str(self._proc.pid)]
                + [self._tmp.name],
                start_new_session=True,
            )
            self._reply()  # loaded and warmed up
            os.killpg(self._proc.pid, signal.SIGSTOP)
        except BaseException:
            self.close()
            raise

    def run(self, workload, warm: bool = False) -> dict:
        """The row for vLLM on ``workload`` (timed over a second pass when ``warm``, like
        ``run_engine``)."""
        job = {
            "warm": warm,
            "waves": [
                [{"prompt": r.prompt.tolist(), "max_tokens": r.max_tokens} for r in wave]
                for wave in workload.waves
            ],
        }
        with contextlib.suppress(ProcessLookupError):  # gone: _reply says why
            os.killpg(self._proc.pid, signal.SIGCONT)
        try:
            self._proc.stdin.write(json.dumps(job).encode() + b"\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            pass  # it has gone: _reply says why
        result = self._reply()
        os.killpg(self._proc.pid, signal.SIGSTOP)
        return workload.row("vllm", result["seconds"], result["cached_tokens"])

    def _reply(self) -> dict:
        """Its next line, or its log once it has exited without one (a worker that
        inherited the pipe may keep it open: the process's exit decides, not EOF)."""
        fd, data = self._proc.stdout.fileno(), b""
        while not data.endswith(b"\n"):
            if select.select([fd], [], [], 0.2)[0]:
                chunk = os.read(fd, 1 << 16)
                data += chunk
                if chunk:
                    continue
            if self._proc.poll() is not None:
                raise RuntimeError(f"vLLM run failed:\n{self._log.read_text()[-3000:]}")
        return json.loads(data)

    def close(self) -> None:
        if self._proc is not None:
            _kill_group(self._proc.pid)
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()
            self._proc = None
        if self._watcher is not None:
            self._watcher.kill()
            self._watcher.wait()
            self._watcher = None
        self._tmp.cleanup()

    def __enter__(self) -> VllmPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _kill_group(pgid: int, wait_s: float = 10.0) -> None:
    """SIGKILL the group and wait (up to ``wait_s``) until none of it still runs: the signal
    lands asynchronously, and the workers are not our children to wait for."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while _group_running(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs (zombies do not: only their reaping is left,
    which falls to whoever adopted them)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            # after the command's closing parenthesis: state, ppid, pgrp
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(pgrp) == pgid and state != "Z":
                return True
    return False


def _watch(owner: int, group: int, folder: str) -> None:
    """Kill ``group`` (vLLM's workers ignore SIGTERM, and a stopped process takes only
    SIGKILL) and remove the peer's ``folder`` once ``owner`` is gone: a benchmark killed
    outright runs no cleanup."""
    while os.getppid() == owner:
        time.sleep(0.5)
    _kill_group(group)
    shutil.rmtree(folder, ignore_errors=True)


def _main(setup: str) -> None:
    # replies on a private copy of stdout; whatever vLLM prints goes to the log instead
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.loads(setup)
    llm = LLM(
        model=job["model_dir"],
        enable_prefix_caching=True,
        dtype=job["dtype"],
        max_model_len=4096,
        block_size=job["block_size"],
    )
    llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], SamplingParams(max_tokens=2))

    def send(waves: list) -> int:
        cached = 0
        for wave in waves:
            prompts = [TokensPrompt(prompt_token_ids=r["prompt"]) for r in wave]
            params = [
                SamplingParams(max_tokens=r["max_tokens"], temperature=0, ignore_eos=True)
                for r in wave
            ]
            outs = llm.generate(prompts, params, use_tqdm=False)
            cached += sum(o.num_cached_tokens or 0 for o in outs)
        return cached

    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in sys.stdin:
        work = json.loads(line)
        llm.reset_prefix_cache()  # the row's hit rate shows a cache it failed to empty
        if work["warm"]:
            send(work["waves"])
        start = time.perf_counter()
        cached = send(work["waves"])
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "cached_tokens": cached}), file=replies, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--watch":
        _watch(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        _main(sys.argv[1])
