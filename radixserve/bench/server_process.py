"""A ``radixserve serve`` child process on a free loopback port, for load checks and tests
that need the real command: its own interpreter, its own signals, its own exit code."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import httpx

from radixserve.server.app import SHUTDOWN_COMPLETE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """Starts ``radixserve serve ARGS`` and waits for ``/health``; ``stop`` sends SIGTERM and
    returns the exit code. Output goes to a file so a chatty server never blocks on a pipe."""

    def __init__(self, args: Sequence[str], startup_timeout_s: float = 180.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fd, self.log_path = tempfile.mkstemp(prefix="radixserve-", suffix=".log")
        cmd = [sys.executable, "-m", "radixserve.cli", "serve", "--port", str(self.port), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env)
        os.close(fd)
        self._wait_healthy(startup_timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"server not healthy after {timeout_s:.0f} s:\n{self.output()}")

    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout_s: float = 60.0) -> bool:
        """SIGTERM, then wait; True when the server shut down gracefully. Like most servers,
        uvicorn re-raises the signal once it has shut down, so the exit status is -SIGTERM."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return False
        return code in (0, -signal.SIGTERM) and SHUTDOWN_COMPLETE in self.output()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        os.unlink(self.log_path)
