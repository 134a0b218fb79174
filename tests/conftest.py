"""Shared fixtures."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from tests.helpers import TINY


@pytest.fixture
def tiny_config() -> dict:
    return copy.deepcopy(TINY)


# Session servers shared by tests/serve_triton and tests/serve_cli: one tiny exported
# repository, one Triton and one rec-server for the whole run (each suite had its own copy).
@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory):
    from tests.serve_triton import servers

    return servers.tiny_repository(tmp_path_factory)


@pytest.fixture(scope="session")
def triton(tiny_repo):
    from tests.serve_triton import servers

    server = servers.triton_server(tiny_repo)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cpp(tiny_repo):
    from tests.serve_triton import servers

    server = servers.cpp_server(tiny_repo)
    yield server
    server.stop()


# scripts/test_sanitized.sh runs the server suites against the ASan/UBSan build with
# ASAN_OPTIONS/UBSAN_OPTIONS log_path under $REC_SANITIZER_LOGS. A report is written there by
# whichever process hit it (a server a fixture started, or one `rec serve` spawned), so the run
# fails on any report even when no test happened to watch that process die.
def pytest_sessionfinish(session, exitstatus):
    log_dir = os.environ.get("REC_SANITIZER_LOGS")
    if not log_dir or not Path(log_dir).is_dir():
        return
    reports = sorted(p for p in Path(log_dir).iterdir() if p.is_file() and p.stat().st_size)
    if not reports:
        return
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    terminal.ensure_newline()
    for report in reports:
        terminal.write_line(f"--- sanitizer report {report.name} ---", red=True)
        terminal.write_line(report.read_text(errors="replace")[-20000:])
    terminal.write_line(f"{len(reports)} sanitizer report(s) in {log_dir}", red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
