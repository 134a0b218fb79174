"""Fixtures of the CLI tests: the same session servers as tests/serve_triton (servers.py)."""

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
