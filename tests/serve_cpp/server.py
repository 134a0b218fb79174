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
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("REC_SERVER") or REPO_ROOT / "build" / "cpp" / "rec-server")
_READY = re.compile(r"^rec-server ready http=(\S+) grpc=(\S+) metrics=(\S+)")
_SUMMARY = re.compile(r"([\w.-]+): (\d+) succeeded, (\d+) failed, (-?\d+) pending")


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

    def metric(self, name: str, model: str = "rec") -> float:
        """The value of Prometheus metric `name` for `model`, read from the server's metrics
        port: the server's own count, for tests that must not judge it by a client's clock."""
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        labels = rf'\{{[^}}]*model="{re.escape(model)}"[^}}]*\}}'
        pattern = re.compile(rf"^{re.escape(name)}{labels} (\S+)$")
        values = [float(m.group(1)) for m in map(pattern.match, text.splitlines()) if m]
        if not values:
            raise KeyError(f"no {name} for model {model!r} in /metrics")
        return sum(values)

    def wait_for_metric(self, name: str, at_least: float, timeout: float = 60.0) -> float:
        """Polls `metric(name)` until it reaches `at_least`; fails the test after `timeout` s."""
        deadline = time.monotonic() + timeout
        while (value := self.metric(name)) < at_least:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} stayed at {value} < {at_least} for {timeout} s")
            time.sleep(0.02)
        return value

    def shutdown_counts(self, model: str = "rec") -> dict[str, int]:
        """The counts in the server's "shutdown complete (...)" line, after stop(): requests
        that `model` answered with success or failure, and those still pending (0 after a clean
        drain)."""
        for line in self.stderr().splitlines():
            if "shutdown complete (" not in line:
                continue
            for m in _SUMMARY.finditer(line):
                if m.group(1) == model:
                    counts = map(int, m.groups()[1:])
                    return dict(zip(("succeeded", "failed", "pending"), counts, strict=True))
        raise AssertionError(f"no shutdown summary for {model!r} in:\n{self.stderr()[-2000:]}")

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
