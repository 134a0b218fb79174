"""Shared fixtures."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from tests import tiers
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
# fails on any report even when no test happened to watch that process die. Each report is
# named with the test during which it appeared, so a finding can be reproduced alone.
def _sanitizer_reports() -> set[Path]:
    log_dir = os.environ.get("REC_SANITIZER_LOGS")
    if not log_dir or not Path(log_dir).is_dir():
        return set()
    return {p for p in Path(log_dir).iterdir() if p.is_file() and p.stat().st_size}


_report_origin: dict[Path, str] = {}


# Called in the process that reports (pytest-xdist's controller, or pytest alone) as each test's
# teardown ends. Under xdist the other worker's test may be the one that made a report: the name
# says where to look, and the report's own stack says what.
def pytest_runtest_logreport(report):
    if report.when != "teardown":
        return
    for found in _sanitizer_reports() - _report_origin.keys():
        _report_origin[found] = report.nodeid


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller judges
        return
    reports = sorted(_sanitizer_reports())
    if not reports:
        return
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    terminal.ensure_newline()
    for report in reports:
        origin = _report_origin.get(report, "session teardown (a shared server)")
        terminal.write_line(f"--- sanitizer report {report.name}, during {origin} ---", red=True)
        terminal.write_line(report.read_text(errors="replace")[-20000:])
    where = reports[0].parent
    terminal.write_line(f"{len(reports)} sanitizer report(s) in {where}", red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# tests/deploy runs the compose stack in Docker; `make test-deploy` builds the images and runs it
# (REC_DEPLOY=1). The main suite leaves it out rather than skipping each test.
collect_ignore = [] if os.environ.get("REC_DEPLOY") else ["deploy"]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "integration: trains, serves or compiles (tests/tiers.py); make check skips it"
    )
    tiers.guard_check_tier()


def pytest_collection_modifyitems(config, items):
    tiers.mark(items, Path(__file__).parent)
