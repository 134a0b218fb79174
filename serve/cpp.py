"""Starting rec's C++ LibTorch server (cpp/, built into build/cpp/rec-server by `make setup`).

The server reads the user's repository directly (pytorch_libtorch config, model.pt, rec.json),
picks free ports for 0, and prints `rec-server ready http=H:P grpc=H:P metrics=H:P` once it
serves; that line is how we learn it is ready and where it listens.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

from rec.serve.process import Endpoints, ServerProcess, launch, pick_ports, wait_until
from rec.serve.repository import ServeError, list_models, load_model

_READY = re.compile(r"^rec-server ready http=(\S+) grpc=(\S+) metrics=(\S+)")
# An editable install maps rec.serve to <checkout>/serve, so the build lies beside it.
_CHECKOUT = Path(__file__).resolve().parent.parent


def find_cpp_server() -> Path:
    """build/cpp/rec-server of this checkout, $REC_SERVER, or rec-server on PATH."""
    candidates = [os.environ.get("REC_SERVER", ""), str(_CHECKOUT / "build" / "cpp" / "rec-server")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    on_path = shutil.which("rec-server")
    if on_path:
        return Path(on_path)
    raise ServeError(
        f"the C++ server is not built ({_CHECKOUT / 'build/cpp/rec-server'} is missing): "
        "run make setup"
    )


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
    binary = find_cpp_server()
    # One clear error here rather than in the server's log; without --model it serves them all.
    if model is not None:
        load_model(repo, model)
    elif not list_models(repo):
        raise ServeError(f"model repository {str(repo)!r} holds no model (<model>/config.pbtxt)")
    # Taken ports are reported here; 0 stays 0 so the server binds a free port itself.
    for port in (http_port, grpc_port, metrics_port):
        if port:
            pick_ports(host, [port])
    argv = [str(binary), "--model-repository", str(Path(repo).resolve()), "--host", host]
    argv += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    argv += ["--metrics-port", str(metrics_port), *extra_args]
    if model is not None:
        argv += ["--model", model]
    logs = Path(tempfile.mkdtemp(prefix="rec-cpp-"))
    found: list[Endpoints] = []
    seen = threading.Event()

    def on_line(line: str) -> None:
        m = _READY.match(line)
        if m:
            found.append(Endpoints(*m.groups()))
            seen.set()

    server = launch("rec-server", argv, logs / "rec-server.log", None, echo, on_line)
    server._on_stop.append(lambda: shutil.rmtree(logs, ignore_errors=True))
    wait_until(server, seen.is_set, ready_timeout, "ready")
    server.endpoints = found[0]
    return server
