"""Starts rec-server on free ports and stops it; the tests' only way to run it.

The binary is $REC_SERVER when set (the sanitized build: scripts/test_sanitized.sh), else
build/cpp/rec-server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("REC_SERVER") or REPO_ROOT / "build" / "cpp" / "rec-server")
_READY = re.compile(r"^rec-server ready http=(\S+) grpc=(\S+) metrics=(\S+)")


class Server:
    """A running rec-server; `http`, `grpc` and `metrics` are host:port strings."""

    def __init__(self, repo: Path, *args: str, timeout: float = 60.0) -> None:
        argv = [str(BINARY), "--model-repository", str(repo)]
        argv += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.log: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = _READY.match(line)
            if m:
                self.http, self.grpc, self.metrics = m.groups()
                return
        self.proc.kill()
        self.proc.wait()
        time.sleep(0.1)
        raise RuntimeError(f"rec-server did not become ready:\n{self.stderr()}")

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    def stderr(self) -> str:
        return "".join(self.log)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def run_to_exit(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Runs rec-server with `args` expecting it to exit by itself (bad flags, bad repository)."""
    return subprocess.run(
        [str(BINARY), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
