"""A server child process: ports, launch, readiness, log capture and clean shutdown.

Shared by the Triton and C++ launchers. The child's stdout and stderr go through one reader
thread into a log file (and, for `rec serve`, the console), so a chatty server can never block
on a full pipe, and a server that dies before it is ready is reported with its last log lines.
`stop()` sends SIGTERM and returns the exit code; `peak_rss_bytes()` is the kernel's high-water
mark of the child's resident set (`tree_peak_rss_bytes()`: with its children's), for the
benchmarks.
"""

from __future__ import annotations

import contextlib
import errno
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rec.serve.repository import ServeError

# An error line of Triton's log (glog: E<mmdd> ...) or rec-server's (... ERROR rec-server: ...).
_ERROR_LINE = re.compile(r"^E\d{4} |^\S+ ERROR ")


@dataclass(frozen=True)
class Endpoints:
    """Where a ready server listens, as host:port strings (what tritonclient takes as url)."""

    http: str
    grpc: str
    metrics: str

    def describe(self) -> str:
        return f"http={self.http} grpc={self.grpc} metrics={self.metrics}"


def pick_ports(host: str, ports: list[int]) -> list[int]:
    """Returns `ports` with each 0 replaced by a free port; raises ServeError if one is taken.

    Chosen sockets are held until all are picked, so no port repeats. A port found free here
    can in principle be taken before the server binds it; the server then fails to start and
    its log says so.
    """
    held, chosen = [], []
    try:
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            # As servers bind: a port in TIME_WAIT after a restart is free; a listener is not.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise ServeError(f"port {port} on {host} is already in use") from e
                raise ServeError(f"cannot bind {host}:{port}: {e}") from e
            chosen.append(int(s.getsockname()[1]))
    finally:
        for s in held:
            s.close()
    return chosen


@dataclass
class ServerProcess:
    """A started server. Use as a context manager, or call stop(); both are idempotent."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    endpoints: Endpoints | None = None
    killed: bool = False
    """stop() had to SIGKILL it: it did not exit within its timeout of SIGTERM."""
    not_ready: str | None = None
    """Why its model is not ready yet, while a load the server retries has not succeeded (a
    Triton whose embedding store was unreachable); None when ready."""
    _on_stop: list[Callable[[], None]] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The log's last lines, after its error lines from further up (Triton reports a model
        that failed to load long before its exit, above its status tables)."""
        with contextlib.suppress(OSError):
            log = self.log_path.read_text(errors="replace").splitlines(True)
            errors = [line for line in log[:-lines] if _ERROR_LINE.match(line)]
            return "".join(errors + log[-lines:])
        return ""

    def rss_bytes(self) -> int:
        """The child's resident set now (VmRSS); 0 once it has exited."""
        return _proc_status_kib(self.proc.pid, "VmRSS") * 1024

    def peak_rss_bytes(self) -> int:
        """The kernel's high-water mark of the child's resident set (VmHWM), over its whole life
        so far; read it before stop()."""
        return _proc_status_kib(self.proc.pid, "VmHWM") * 1024

    def tree_peak_rss_bytes(self) -> int:
        """peak_rss_bytes() summed over the child and every process under it now (Triton's
        Python-backend model runs in a stub process of its own): each process's own peak, so
        an upper bound on the tree's peak when they did not peak together."""
        pids, total = [self.proc.pid], 0
        while pids:
            pid = pids.pop()
            total += _proc_status_kib(pid, "VmHWM") * 1024
            pids += child_pids(pid)
        return total

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (Triton and rec-server both drain and exit on it), SIGKILL after `timeout`
        (and `killed` set). Returns the exit code; the log is complete when it returns."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait()
                self.killed = True
        if self._reader is not None:
            self._reader.join(timeout=5)
        while self._on_stop:
            self._on_stop.pop()()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started that are alive now (every thread's /proc children)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _proc_status_kib(pid: int, key: str) -> int:
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM); 0 where it has none (a zombie)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    return 0


def launch(
    name: str,
    argv: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    echo: bool = False,
    on_line: Callable[[str], None] | None = None,
) -> ServerProcess:
    """Starts `argv` with stdout+stderr captured into `log_path` (and stderr if `echo`); each
    line also goes to `on_line`, from the reader thread, before stop() returns."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            # Own process group: Ctrl-C in `rec serve` reaches us once, and we stop the child.
            start_new_session=True,
        )
    except OSError as e:
        raise ServeError(f"cannot start {name} ({argv[0]}): {e}") from e
    server = ServerProcess(name, proc, log_path)

    def pump() -> None:
        with open(log_path, "w", buffering=1) as log:
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                log.write(line)
                if echo:
                    sys.stderr.write(line)
                if on_line is not None:
                    on_line(line)

    server._reader = threading.Thread(target=pump, name=f"{name}-log", daemon=True)
    server._reader.start()
    return server


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_until(
    server: ServerProcess,
    ready: Callable[[], bool] | threading.Event,
    timeout: float,
    what: str,
) -> None:
    """Polls `ready` until true (an Event: waits on it, so a set one returns at once); stops the
    server and raises with its log if it dies or stalls."""
    deadline = time.monotonic() + timeout
    event = isinstance(ready, threading.Event)
    is_ready, pause = (ready.is_set, ready.wait) if event else (ready, time.sleep)
    while time.monotonic() < deadline:
        if is_ready():
            return
        if not server.alive():
            server.proc.wait()
            if server._reader is not None:
                server._reader.join(timeout=5)
            tail = server.log_tail()  # before stop(), which may delete the log's directory
            server.stop()
            raise ServeError(
                f"{server.name} exited with code {server.proc.returncode} before {what}; "
                f"last log lines:\n{tail}"
            )
        pause(0.1)
    tail = server.log_tail()
    server.stop()
    raise ServeError(f"{server.name} was not {what} after {timeout:.0f}s; last log lines:\n{tail}")
