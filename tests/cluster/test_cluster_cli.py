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
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        out = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"prompt": list(range(3, 43)), "max_tokens": 4},
            timeout=60,
        )
        assert out.json()["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    left = subprocess.run(["pgrep", "-f", folder], capture_output=True, text=True)
    shutil.rmtree(folder, ignore_errors=True)
    assert left.stdout == ""  # no raylet, GCS or worker of that cluster remains
