"""Starting rec's C++ LibTorch server (cpp/, built into build/cpp/rec-server by `make setup`): the
one launcher of rec-server, for `rec serve`, the tests (tests/serve_cpp/server.py) and the
benchmarks.

The server reads the user's repository directly (pytorch_libtorch config, model.pt, rec.json),
picks free ports for 0, and prints `rec-server ready http=H:P grpc=H:P metrics=H:P` once it
serves; that line is how we learn it is ready and where it listens. `launch_cpp` starts it and
waits for that line; `start_cpp` (`rec serve`) checks the repository and the ports first.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

from rec.serve.process import Endpoints, ServerProcess, launch, pick_ports, wait_until
from rec.serve.repository import ServeError, list_models, load_model

_READY = re.compile(r"^rec-server ready http=(\S+) grpc=(\S+) metrics=(\S+)")
# An editable install maps rec.serve to <checkout>/serve, so the build lies beside it.
_CHECKOUT = Path(__file__).resolve().parent.parent


def cpp_server_path() -> Path:
    """The rec-server to run, not checked: $REC_SERVER when set (the sanitized build under
    scripts/test_sanitized.sh), else build/cpp/rec-server of this checkout when built, else
    rec-server on PATH, else the build's path (missing)."""
    if os.environ.get("REC_SERVER"):
        return Path(os.environ["REC_SERVER"])
    built = _CHECKOUT / "build" / "cpp" / "rec-server"
    on_path = shutil.which("rec-server")
    return Path(on_path) if on_path and not built.is_file() else built


def find_cpp_server() -> Path:
    """cpp_server_path(), or a ServeError saying why there is none to run."""
    path = cpp_server_path()
    if path.is_file() and os.access(path, os.X_OK):
        return path
    if os.environ.get("REC_SERVER"):
        raise ServeError(f"$REC_SERVER is {path}, which is not an executable file")
    raise ServeError(f"the C++ server is not built ({path} is missing): run make setup")


def launch_cpp(
    repo: Path,
    *args: str,
    host: str | None = None,
    http_port: int = 0,
    grpc_port: int = 0,
    metrics_port: int = 0,
    env: dict[str, str] | None = None,
    echo: bool = False,
    on_line: Callable[[str], None] | None = None,
    ready_timeout: float = 120.0,
) -> ServerProcess:
    """Starts rec-server on `repo` with more flags `args` (ports 0: free ones) and returns it
    once it printed its ready line, with its endpoints. Its output goes to a log file (removed by
    stop()), to stderr if `echo`, and line by line to `on_line`. Raises ServeError with the log's
    last lines if it exits or stalls first."""
    argv = [str(find_cpp_server()), "--model-repository", str(repo)]
    argv += ["--host", host] if host is not None else []
    argv += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    argv += ["--metrics-port", str(metrics_port), *args]
    logs = Path(tempfile.mkdtemp(prefix="rec-cpp-"))
    found: list[Endpoints] = []
    seen = threading.Event()

    def read_line(line: str) -> None:
        if on_line is not None:
            on_line(line)
        m = _READY.match(line)
        if m and not seen.is_set():
            found.append(Endpoints(*m.groups()))
            seen.set()

    server = launch("rec-server", argv, logs / "rec-server.log", env, echo, read_line)
    server._on_stop.append(lambda: shutil.rmtree(logs, ignore_errors=True))
    wait_until(server, seen, ready_timeout, "ready")
    server.endpoints = found[0]
    return server


def start_cpp(
    repo: Path,
    model: str | None = None,
    host: str = "127.0.0.1",
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    extra_args: tuple[str, ...] = (),
    echo: bool = False,
    ready_timeout: float = 120.0,
) -> ServerProcess:
    """Starts rec-server on `repo` (its `model`, or all models) and returns once it is ready."""
    find_cpp_server()
    # One clear error here rather than in the server's log; without --model it serves them all.
    if model is not None:
        load_model(repo, model)
    elif not list_models(repo):
        raise ServeError(f"model repository {str(repo)!r} holds no model (<model>/config.pbtxt)")
    # Taken ports are reported here; 0 stays 0 so the server binds a free port itself.
    for port in (http_port, grpc_port, metrics_port):
        if port:
            pick_ports(host, [port])
    args = [*extra_args, *(["--model", model] if model is not None else [])]
    ports = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    server = launch_cpp(
        Path(repo).resolve(), *args, host=host, **ports, echo=echo, ready_timeout=ready_timeout
    )
    # A courtesy: the server is up either way, and an index it cannot give changes nothing.
    with contextlib.suppress(OSError, ValueError):
        server.not_ready = not_ready(server.endpoints.http)
    return server


def not_ready(http: str) -> str | None:
    """Why rec-server's models that did not load are not ready (its repository index), or
    None. rec-server comes up with such a model (an unreachable embedding store, say) and
    retries it; `rec serve` says so rather than calling it ready."""
    request = urllib.request.Request(f"http://{http}/v2/repository/index", data=b"{}",
                                     method="POST")  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as r:
        index = json.loads(r.read())
    reasons = [f"model '{m['name']}': {m.get('reason') or m.get('state')}" for m in index
               if m.get("state") != "READY"]  # fmt: skip
    return "; ".join(reasons) or None
