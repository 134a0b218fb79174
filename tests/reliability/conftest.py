"""Fixtures of the reliability tests: the real `rec train` -> `rec export` model."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from live_server import BINARY, export_model  # noqa: E402

from rec.contract.repository import ModelDir


@pytest.fixture(scope="session")
def exported_repo(tmp_path_factory) -> Path:
    if not BINARY.exists():
        pytest.skip(f"{BINARY} is not built (run scripts/setup.sh)")
    return export_model(tmp_path_factory)


@pytest.fixture(scope="session")
def manifest(exported_repo) -> dict:
    return json.loads(ModelDir.of(exported_repo, "rec").manifest.read_text())
