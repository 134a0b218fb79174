import sys
from pathlib import Path

import pytest

# The helpers live beside this file; pytest runs with --import-mode=importlib, which does not put
# test folders on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_model  # noqa: E402
from server import BINARY, Server  # noqa: E402

from rec.contract.repository import ModelDir


def pytest_collection_modifyitems(config, items):
    if BINARY.exists():
        return
    skip = pytest.mark.skip(reason=f"{BINARY} is not built (run scripts/setup.sh)")
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("cpp_repo")
    tiny_model.write_model(repo)
    return repo


@pytest.fixture(scope="session")
def reference(repo) -> tiny_model.Reference:
    return tiny_model.Reference(ModelDir.of(repo, "rec").model_file(1))


@pytest.fixture(scope="session")
def server(repo):
    s = Server(repo, "--executor-threads", "2", "--http-threads", "2")
    yield s
    assert s.stop() == 0, s.stderr()
