"""Shared fixtures."""

from __future__ import annotations

import copy

import pytest

from tests.helpers import TINY


@pytest.fixture
def tiny_config() -> dict:
    return copy.deepcopy(TINY)
