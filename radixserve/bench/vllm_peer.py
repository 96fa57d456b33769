"""vLLM (with automatic prefix caching) on a serving workload, in its own interpreter.

vLLM lives in a virtual environment of its own (see ``../shared/peers.md``), never as a
dependency of radixserve. ``run_vllm`` writes the workload to JSON and runs this file with
that environment's Python; run as a script, the file imports only vLLM and the standard
library, times ``generate`` wave by wave, and writes the timings back.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def run_vllm(
    python: str, model: str, workload, page_size: int, dtype: str = "float32", warm: bool = False
) -> dict:
    """The row for vLLM on ``workload``, the same checkpoint exported to a directory
    (timed over a second pass when ``warm``, like ``run_engine``)."""
    from radixserve.engine import compute_thread
    from radixserve.model.presets import PRESETS, export_preset

    with tempfile.TemporaryDirectory(prefix="radixserve-vllm-") as tmp:
        # built on the engines' compute thread: torch work on this thread would start a
        # second OpenMP team, which slows every engine of this process (compute_thread.py)
        model_dir = (
            str(compute_thread.call(lambda: export_preset(model, Path(tmp) / "model")))
            if model in PRESETS
            else model
        )
        job = {
            "model_dir": model_dir,
            "block_size": -(-page_size // 32) * 32,  # its CPU attention wants multiples of 32
            "dtype": dtype,
            "warm": warm,
            "waves": [
                [{"prompt": r.prompt.tolist(), "max_tokens": r.max_tokens} for r in wave]
                for wave in workload.waves
            ],
        }
        src, dst = Path(tmp) / "job.json", Path(tmp) / "result.json"
        src.write_text(json.dumps(job))
        env = {
            **os.environ,
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_CPU_KVCACHE_SPACE": "4",
        }
        # its own process group, so that vLLM's workers go with it whatever happens here;
        # its log in a file, which a worker still holding it cannot keep open-ended
        log = Path(tmp) / "stderr.txt"
        with log.open("w") as err:
            proc = subprocess.Popen(
                [python, __file__, str(src), str(dst)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
            try:
                proc.wait()
            finally:
                _kill_group(proc.pid)
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM run failed:\n{log.read_text()[-3000:]}")
        result = json.loads(dst.read_text())
    prompt = workload.prompt_tokens
    outputs = sum(r.max_tokens for r in workload.requests)
    return {
        "workload": workload.name,
        "config": "vllm",
        "requests": len(workload.requests),
        "seconds": result["seconds"],
        "req_s": len(workload.requests) / result["seconds"],
        "tok_s": (prompt + outputs) / result["seconds"],
        "hit_rate": result["cached_tokens"] / prompt,
        "prefill_tokens": prompt - result["cached_tokens"],
    }


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


def _die_with(parent: int) -> None:
    """Kill this process group (vLLM's workers ignore SIGTERM) once ``parent`` is gone: a
    benchmark killed outright runs no cleanup of its own."""
    while os.getppid() == parent:
        time.sleep(0.5)
    _kill_group(os.getpgid(0))


def _main(src: str, dst: str) -> None:
    threading.Thread(target=_die_with, args=(os.getppid(),), daemon=True).start()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.loads(Path(src).read_text())
    llm = LLM(
        model=job["model_dir"],
        enable_prefix_caching=True,
        dtype=job["dtype"],
        max_model_len=4096,
        block_size=job["block_size"],
    )
    llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], SamplingParams(max_tokens=2))
    llm.reset_prefix_cache()

    def send() -> int:
        cached = 0
        for wave in job["waves"]:
            prompts = [TokensPrompt(prompt_token_ids=r["prompt"]) for r in wave]
            params = [
                SamplingParams(max_tokens=r["max_tokens"], temperature=0, ignore_eos=True)
                for r in wave
            ]
            outs = llm.generate(prompts, params, use_tqdm=False)
            cached += sum(o.num_cached_tokens or 0 for o in outs)
        return cached

    if job["warm"]:
        send()
    start = time.perf_counter()
    cached = send()
    seconds = time.perf_counter() - start
    Path(dst).write_text(json.dumps({"seconds": seconds, "cached_tokens": cached}))


if __name__ == "__main__":
    _main(*sys.argv[1:3])
