"""rec-server for the tests: rec.serve.cpp.launch_cpp (the one launcher, shared with `rec serve`
and the benchmarks) with the tests' settings, and what the tests read from a running server.

The binary is $REC_SERVER when set (the sanitized build: scripts/test_sanitized.sh), else
build/cpp/rec-server (rec.serve.cpp.cpp_server_path)."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

from rec.serve.cpp import cpp_server_path, launch_cpp
from rec.serve.repository import ServeError

BINARY = cpp_server_path()
_SUMMARY = re.compile(r"([\w.-]+): (\d+) succeeded, (\d+) failed, (-?\d+) pending")


class Server:
    """A running rec-server on free ports; `http`, `grpc` and `metrics` are host:port strings,
    `log` its output (stdout and stderr) line by line, kept after stop()."""

    def __init__(self, repo: Path, *args: str, timeout: float = 60.0) -> None:
        self.log: list[str] = []
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            self.process = launch_cpp(
                repo, *args, env=env, on_line=self.log.append, ready_timeout=timeout
            )
        except ServeError as e:
            raise RuntimeError(f"rec-server did not become ready:\n{self.stderr()}") from e
        self.proc = self.process.proc
        ends = self.process.endpoints
        self.http, self.grpc, self.metrics = ends.http, ends.grpc, ends.metrics

    def stderr(self) -> str:
        return "".join(self.log)

    def metric(self, name: str, model: str = "rec", **labels: str) -> float:
        """The value of Prometheus metric `name` for `model` (summed over its series, or those
        with `labels`), read from the server's metrics port: the server's own count, for tests
        that must not judge it by a client's clock."""
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        pattern = re.compile(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$")
        want = {f'{k}="{v}"' for k, v in {"model": model, **labels}.items()}
        values = [float(m.group(2)) for m in map(pattern.match, text.splitlines())
                  if m and want <= set(m.group(1).split(","))]  # fmt: skip
        if not values:
            raise KeyError(f"no {name} for model {model!r} {labels or ''} in /metrics")
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
        """SIGTERM, then wait; returns the exit code. Raises TimeoutExpired (after a SIGKILL)
        if the server did not exit within `timeout` s."""
        code = self.process.stop(timeout)
        if self.process.killed:
            raise subprocess.TimeoutExpired(self.proc.args, timeout, output=self.stderr())
        return code


def run_to_exit(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Runs rec-server with `args` expecting it to exit by itself (bad flags, bad repository)."""
    return subprocess.run(
        [str(BINARY), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
