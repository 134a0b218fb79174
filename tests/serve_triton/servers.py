"""Servers for the serving tests, started once per test session and shared by both test folders.

Both conftests (serve_triton, serve_cli) ask here, so a session runs at most one Triton and one
rec-server, on free ports of 127.0.0.1. Every server is stopped by the fixture that asked for it
(stop() is idempotent), at the end of the session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rec.broker import redis_server_path
from rec.serve.cpp import find_cpp_server, start_cpp
from rec.serve.process import ServerProcess
from rec.serve.repository import ServeError
from rec.serve.triton import TritonInstall, start_triton
from tests.serve_triton.tiny_repo import write_tiny_repository

_cache: dict[str, object] = {}


def _triton_missing() -> str | None:
    try:
        TritonInstall.find()
    except ServeError as e:
        return str(e)
    return None


TRITON_AND_REDIS = [
    pytest.mark.skipif(redis_server_path() is None,
                       reason="redis-server is not installed (make setup installs it)"),
    pytest.mark.skipif(_triton_missing() is not None, reason=str(_triton_missing())),
]  # fmt: skip
"""The skip marks of a test module that needs the Triton binary and redis-server."""
FREE_PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}


def tiny_repository(factory: pytest.TempPathFactory) -> Path:
    if "repo" not in _cache:
        repo = factory.mktemp("repo")
        write_tiny_repository(repo, factory.mktemp("work"))
        _cache["repo"] = repo
    return _cache["repo"]


def triton_server(repo: Path) -> ServerProcess:
    if "triton" not in _cache:
        _cache["triton"] = start_triton(repo, **FREE_PORTS)
    return _cache["triton"]


def cpp_server(repo: Path) -> ServerProcess:
    """The C++ server, or a pytest skip saying why it is not available."""
    if "cpp" not in _cache:
        try:
            find_cpp_server()
        except ServeError as e:
            _cache["cpp"] = str(e)
        else:
            _cache["cpp"] = start_cpp(repo, **FREE_PORTS)
    if isinstance(_cache["cpp"], str):
        pytest.skip(_cache["cpp"])
    return _cache["cpp"]
