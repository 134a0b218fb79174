"""`rec serve`: start the chosen server on a repository, in the foreground, until a signal.

Both servers read the same repository: `cpp` is rec's LibTorch server (build/cpp/rec-server),
`triton` is nvidia-pytriton's tritonserver with rec's Python-backend model (see rec.serve.triton).
"""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from rec.serve.cpp import start_cpp
from rec.serve.process import ServerProcess
from rec.serve.repository import ServeError
from rec.serve.triton import start_triton

BACKENDS = ("cpp", "triton")


@dataclass(frozen=True)
class ServeConfig:
    repo: Path
    backend: str = "cpp"
    model: str | None = None
    """Model to serve; None: the repository's only model (Triton) or all models (cpp)."""
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    """0 picks a free port; the chosen ones are printed."""
    verbose: bool = False
    """Echo the server's own log to stderr."""
    server_args: tuple[str, ...] = ()
    """More rec-server flags, as given (cpp backend only), e.g. ("--busy-poll-us=0",)."""
    allow_batch_variant: bool = False
    """Serve a model that fails the load-time batch probe on this CPU (rec.batch_probe) with a
    warning and the rec_model_batch_variant metric, instead of refusing it."""


def start_server(cfg: ServeConfig) -> ServerProcess:
    """Starts the configured backend and returns it ready (stop() it when done)."""
    if cfg.backend not in BACKENDS:
        raise ServeError(f"backend {cfg.backend!r} is not one of {BACKENDS}")
    if cfg.server_args and cfg.backend != "cpp":
        raise ServeError(f"--server-arg passes flags to rec-server, not to {cfg.backend}")
    ports = {"http_port": cfg.http_port, "grpc_port": cfg.grpc_port,
             "metrics_port": cfg.metrics_port}  # fmt: skip
    if cfg.backend == "cpp":
        extra = (*cfg.server_args, *(["--allow-batch-variant"] if cfg.allow_batch_variant else []))
        return start_cpp(Path(cfg.repo), model=cfg.model, host=cfg.host, **ports,
                         extra_args=extra, echo=cfg.verbose)  # fmt: skip
    return start_triton(Path(cfg.repo), model=cfg.model, host=cfg.host, **ports,
                        echo=cfg.verbose, allow_batch_variant=cfg.allow_batch_variant)  # fmt: skip


def serve_forever(cfg: ServeConfig) -> int:
    """Serves until SIGINT/SIGTERM or until the server exits; returns the exit code to use."""
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame) -> None:
        received.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = start_server(cfg)
        try:
            ep = server.endpoints
            if server.not_ready:  # up, its model retried (rec-server says so in its log)
                print(f"rec serve: {cfg.backend} up {ep.describe()}, model NOT READY: "
                      f"{server.not_ready}", flush=True)  # fmt: skip
            else:
                print(f"rec serve: {cfg.backend} ready {ep.describe()}", flush=True)
            print(f"  try: rec predict --url {ep.http} --synthetic 4", flush=True)
            while not stop.wait(0.5):
                if not server.alive():
                    print(
                        f"rec serve: {server.name} exited with code {server.proc.returncode}; "
                        f"last log lines:\n{server.log_tail()}",
                        file=sys.stderr,
                    )
                    return 1
            print(f"rec serve: {signal.Signals(received[0]).name}: stopping", flush=True)
        finally:
            code = server.stop()
        print(f"rec serve: stopped ({server.name} exit code {code})", flush=True)
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
