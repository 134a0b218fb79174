"""Fixtures of the data-layer tests: small configs, exact batch comparisons, and the stream
readers' feature spec and redis-server (a module's own)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rec.batch import RecBatch
from rec.broker import RedisBroker
from rec.config import RecConfig, config_from_dict
from rec.features import HASH, DenseFeature, FeatureSpec, SparseFeature

# The stream readers' events: a label, one dense feature and one item id each.
STREAM_SPEC = FeatureSpec(
    "csv",
    ["clicked"],
    [DenseFeature("n", "n", "identity")],
    [SparseFeature("item", "item", "int_or_hash", "|")],
    dict(HASH),
)


def small_config(data: dict[str, Any] | None = None, **top: Any) -> RecConfig:
    """4 tables of a few hundred rows, 3 dense features; `data` merges into the data section."""
    base = {
        "tables": [
            {"name": f"t{i}", "rows": r, "dim": 8, "features": [f"cat_{i}"]}
            for i, r in enumerate([300, 50, 1000, 7])
        ],
        "features": {"dense": 3},
        "model": {"dense_arch": [16, 8], "over_arch": [16, 1]},
        "data": {"synthetic": {"train_samples": 10_000, "eval_samples": 3_000}},
    }
    base["data"].update(data or {})
    base.update(top)
    return config_from_dict(base)


def criteo_config(data: dict[str, Any] | None = None, **top: Any) -> RecConfig:
    """13 dense and 26 sparse features (Criteo's shape), one-hot with empty fields."""
    base = {
        "tables": [
            {"name": f"t{i}", "rows": 97 + 13 * i, "dim": 4, "features": [f"C{i + 1}"]}
            for i in range(26)
        ],
        "features": {"dense": 13},
        "model": {"dense_arch": [8, 4], "over_arch": [8, 1]},
        "data": {"synthetic": {"train_samples": 5_000, "eval_samples": 1_000, "max_hotness": 1}},
    }
    base["data"].update(data or {})
    base.update(top)
    return config_from_dict(base)


def slice_batch(b: RecBatch, i: int, j: int) -> RecBatch:
    """Samples [i, j) of a batch."""
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), b.lengths.sum(1).cumsum(0)])
    return RecBatch(b.dense[i:j], b.lengths[i:j], b.values[offsets[i] : offsets[j]], b.labels[i:j])


def assert_same(a: RecBatch, b: RecBatch) -> None:
    """Exactly equal, field by field (dtypes included)."""
    for name in ("dense", "lengths", "values", "labels"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, (name, x.dtype, y.dtype)
        assert x.shape == y.shape, (name, x.shape, y.shape)
        assert torch.equal(x, y), name


def collect(source, batch_size: int, world_size: int, **kw) -> list[list[RecBatch]]:
    """Every rank's batches: result[rank][step]."""
    return [list(source.batches(batch_size, r, world_size, **kw)) for r in range(world_size)]


@pytest.fixture
def util() -> SimpleNamespace:
    return SimpleNamespace(
        small_config=small_config,
        criteo_config=criteo_config,
        slice_batch=slice_batch,
        assert_same=assert_same,
        collect=collect,
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A redis-server of the test module's own (the module skips when none is installed)."""
    with RedisBroker(tmp_path_factory.mktemp("redis")) as b:
        yield b
