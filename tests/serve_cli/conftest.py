"""A context model (features.context) for the tools' tests: the tiny seeded run of the serving
tests exported by the real `rec export` with one dense and two sparse features as context, and
rec-server and Triton on it."""

from __future__ import annotations

import copy

import pytest

from rec.contract.context import ContextSplit
from rec.serve.repository import ServeError
from tests.serve_triton.tiny_repo import TINY, write_seeded_run

CONTEXT = ["user", "tags", "dense_0"]
"""The context: the user's id and tags and one dense feature; item, city and three dense
features stay each candidate's."""
SPLIT = ContextSplit(dense=(0,), sparse=(1, 2), num_dense=4, num_sparse=4)
"""CONTEXT as flat columns (features.sparse is item, user, tags, city)."""


@pytest.fixture(scope="session")
def context_repo(tmp_path_factory):
    from rec.export.pipeline import export_run

    data = copy.deepcopy(TINY)
    data["features"]["context"] = CONTEXT
    run = write_seeded_run(tmp_path_factory.mktemp("context_run") / "run", data)
    repo = tmp_path_factory.mktemp("context_repo")
    export_run(run, repo, log=lambda _msg: None)
    return repo


@pytest.fixture(scope="session")
def cpp_context(context_repo):
    """rec-server on the context model, or a skip saying why it is not available."""
    from rec.serve.cpp import find_cpp_server, start_cpp

    try:
        find_cpp_server()
    except ServeError as e:
        pytest.skip(str(e))
    server = start_cpp(context_repo, http_port=0, grpc_port=0, metrics_port=0)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def triton_context(context_repo):
    """Triton (the Python backend rec serve stages) on the context model."""
    from rec.serve.triton import start_triton

    server = start_triton(context_repo, http_port=0, grpc_port=0, metrics_port=0)
    yield server
    server.stop()
