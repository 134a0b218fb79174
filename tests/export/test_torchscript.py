"""The exported TorchScript model: read from disk, it implements DESIGN.md's I/O table."""

from __future__ import annotations

import json

import pytest
import torch

from rec.config import config_from_dict
from rec.export.load import load_run
from rec.export.module import ServingModule, split_requests
from rec.model import table_rows
from tests.export.conftest import random_request, tiny_dict

NUM_DENSE, NUM_SPARSE = 4, 5


@pytest.fixture(scope="module")
def scripted(exported):
    return torch.jit.load(str(exported.models["torchscript"] / "model.pt"))


@pytest.fixture(scope="module")
def float_module(seeded_run):
    loaded = load_run(seeded_run)
    return ServingModule(loaded.model, loaded.cfg.features.sparse, table_rows(loaded.cfg))


def test_io_table_from_disk(scripted):
    dense, lengths, values = random_request(NUM_DENSE, NUM_SPARSE, 7, seed=1)
    scores = scripted(dense, lengths, values)
    assert scores.dtype == torch.float32 and scores.shape == (7, 1)
    assert bool(((scores > 0) & (scores < 1)).all())
    args = [a.name for a in scripted.forward.schema.arguments][1:]
    assert args == ["dense_features", "sparse_lengths", "sparse_values"]  # Triton maps by name


def test_batched_equals_single_sample_requests_exactly(scripted):
    request = random_request(NUM_DENSE, NUM_SPARSE, 33, seed=2)
    with torch.no_grad():
        batched = scripted(*request)
        singles = torch.cat([scripted(*r) for r in split_requests(*request)])
    assert torch.equal(batched, singles)


def test_concatenated_requests_give_stacked_scores(scripted):
    a = random_request(NUM_DENSE, NUM_SPARSE, 5, seed=3)
    b = random_request(NUM_DENSE, NUM_SPARSE, 300, seed=4)
    both = tuple(torch.cat([x, y]) for x, y in zip(a, b, strict=True))
    with torch.no_grad():
        assert torch.equal(scripted(*both), torch.cat([scripted(*a), scripted(*b)]))


def test_ids_are_mapped_into_tables(scripted):
    dense, lengths, values = random_request(NUM_DENSE, NUM_SPARSE, 4, seed=5)
    rows = table_rows(config_from_dict(tiny_dict()))
    per_value = torch.repeat_interleave(rows.repeat(4), lengths.reshape(-1).long())
    shifted = values + 7 * per_value  # the same rows after the non-negative modulo
    assert torch.equal(scripted(dense, lengths, values), scripted(dense, lengths, shifted))


def test_int8_close_to_float_and_reload_identical(scripted, float_module, exported):
    request = random_request(NUM_DENSE, NUM_SPARSE, 64, seed=6)
    with torch.no_grad():
        diff = (scripted(*request) - float_module(*request)).abs().max().item()
    assert diff < 2e-2
    checks = json.loads((exported.models["torchscript"] / "rec.json").read_text())["verification"]
    assert checks["torchscript_reload_identical"] is True
    assert checks["batched_vs_single_max_diff"]["torchscript"] == 0.0


def test_int8_bytes_at_dim_64():
    """The quality bar's storage half: int8 <= 0.35x fp32 at dim 64 (FBGEMM's padded rows)."""
    from rec.export import torchscript

    data = tiny_dict()
    for t in data["tables"]:
        t["dim"] = 64
    data["model"]["dense_arch"] = [16, 64]
    cfg = config_from_dict(data)
    from rec.model import build_model

    module = ServingModule(build_model(cfg), cfg.features.sparse, table_rows(cfg))
    storage = torchscript.table_storage(
        torchscript.quantize(module, {t.name: "int8" for t in cfg.tables})
    )
    for t in cfg.tables:
        assert storage[t.name]["bytes_stored"] <= 0.35 * t.rows * t.dim * 4


def test_dlrm_dcn_exports_batch_invariant(tmp_path):
    from rec.export.pipeline import export_run
    from tests.export.conftest import write_seeded_run

    data = tiny_dict()
    data["model"]["arch"] = "dlrm_dcn"
    run = write_seeded_run(tmp_path / "run", data)
    result = export_run(run, tmp_path / "repo", log=lambda _: None)
    checks = json.loads((result.models["torchscript"] / "rec.json").read_text())["verification"]
    assert checks["batched_vs_single_max_diff"]["torchscript"] == 0.0
    # The per-sample cross net computes what TorchRec's LowRankCrossNet computes.
    import copy

    from rec.export.module import make_batch_invariant

    loaded = load_run(run)
    module = ServingModule(loaded.model, loaded.cfg.features.sparse, table_rows(loaded.cfg))
    request = random_request(NUM_DENSE, NUM_SPARSE, 50, seed=8)
    with torch.no_grad():
        want = module(*request)
        got = make_batch_invariant(copy.deepcopy(module))(*request)
    assert (got - want).abs().max().item() < 1e-5
