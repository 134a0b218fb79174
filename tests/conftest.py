"""Shared fixtures."""

from __future__ import annotations

import copy

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
