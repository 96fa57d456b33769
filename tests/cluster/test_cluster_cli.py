"""``radixserve serve --replicas 2``: a local Ray and Serve come up behind the front door
and SIGTERM takes all of it down, leaving no process behind."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_takes_the_cluster_down():
    port = free_port()
    cmd = [sys.executable, "-m", "radixserve.cli", "serve", "--replicas", "2", "--port", str(port)]
    folder = tempfile.mkdtemp(prefix="rs-", dir="/tmp")  # short: Ray's socket paths are bounded
    env = os.environ | {"RAY_TMPDIR": folder}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Ray, Serve and two replicas loading the model on two busy cores: minutes at worst
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise AssertionError(f"no healthy front door (exit status {proc.poll()})")
        out = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"prompt": list(range(3, 43)), "max_tokens": 4},
            timeout=60,
        )
        assert out.json()["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:  # a failure above: still take the cluster down cleanly
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    left = subprocess.run(["pgrep", "-f", folder], capture_output=True, text=True)
    shutil.rmtree(folder, ignore_errors=True)
    assert left.stdout == ""  # no raylet, GCS or worker of that cluster remains
