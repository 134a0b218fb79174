"""A Redis server of our own for the update log: tests, the demo and the benchmarks start one on a
free port, with its data in a folder they own, and stop it. Nothing here uses a Redis that the
machine happens to run.

The broker keeps an append-only file fsynced on every write (`appendfsync always`): a broker
killed and restarted on the same folder has every entry it acknowledged, which is what the
update log promises (rec.contract.updates).

Example:
    >>> with RedisBroker(tmp_path) as broker:  # doctest: +SKIP
    ...     url = broker.url("rec:updates")
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

REDIS_SERVER = "redis-server"


class BrokerError(RuntimeError):
    pass


def redis_server_path() -> str | None:
    """The redis-server binary (Debian's `redis-server` package), or None if not installed."""
    return shutil.which(REDIS_SERVER)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RedisBroker:
    """redis-server on `host`:`port` (0: a free one), data and log in `folder`; `extra`: more
    arguments (`--cluster-enabled yes`: a node of no cluster yet, which answers cluster
    commands)."""

    def __init__(
        self, folder: Path, host: str = "127.0.0.1", port: int = 0, extra: Sequence[str] = ()
    ) -> None:
        binary = redis_server_path()
        if binary is None:
            raise BrokerError("redis-server is not installed (Debian: apt-get install "
                              "redis-server; `make setup` installs it)")  # fmt: skip
        # Absolute: redis-server enters --dir before it opens --logfile.
        self.binary, self.folder, self.host = binary, Path(folder).resolve(), host
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = port or _free_port(host)
        self.extra = tuple(extra)
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def log_path(self) -> Path:
        return self.folder / "redis.log"

    def url(self, stream: str = "") -> str:
        return f"redis://{self.host}:{self.port}" + (f"/{stream}" if stream else "")

    def start(self, timeout: float = 20.0) -> None:
        # fmt: off
        args = [self.binary, "--port", str(self.port), "--bind", self.host,
                "--dir", str(self.folder), "--logfile", str(self.log_path),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--daemonize", "no", "--protected-mode", "no", *self.extra]
        # fmt: on
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(f"redis-server exited with {self.proc.returncode} at start; "
                                  f"log: {self.log_tail()}")  # fmt: skip
            if self.ping():
                return
            time.sleep(0.05)
        self.stop()
        raise BrokerError(f"redis-server did not answer PING within {timeout:.0f} s; "
                          f"log: {self.log_tail()}")  # fmt: skip

    def ping(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), 1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
        return False

    def log_tail(self, lines: int = 10) -> str:
        with contextlib.suppress(OSError):
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-lines:])
        return ""

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL, a crash: the append-only file still has every acknowledged
        entry) and wait."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self, kill: bool = False) -> None:
        """Stop and start again on the same port and folder."""
        self.stop(kill=kill)
        self.start()

    def __enter__(self) -> RedisBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
