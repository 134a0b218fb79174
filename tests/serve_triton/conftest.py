"""Serving-test fixtures; the servers are shared with tests/serve_cli (see servers.py)."""

import pytest

from tests.serve_triton import servers


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory):
    return servers.tiny_repository(tmp_path_factory)


@pytest.fixture(scope="session")
def triton(tiny_repo):
    server = servers.triton_server(tiny_repo)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cpp(tiny_repo):
    server = servers.cpp_server(tiny_repo)
    yield server
    server.stop()
