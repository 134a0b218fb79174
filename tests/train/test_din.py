"""Sequence features (model.arch din, examples/din.yaml) in a real 2-rank `rec train`: the
EmbeddingCollection shards and checkpoints, the trainer's held-out AUC is the unsharded
checkpoint's, and the model reads the history (dropping it costs AUC). Its export and serving
are in tests/serve_cli/test_architectures.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from rec.batch import RecBatch
from rec.data import make_source
from rec.export import verify
from rec.export.build import score
from rec.export.load import load_run
from rec.export.module import FloatReference
from rec.model import table_rows
from tests.helpers import rec_in_process, run_rec, write_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "din.yaml"


@pytest.fixture(scope="module")
def din_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("din")
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["tables"][0]["rows"] = 1000  # fewer items: their embeddings learn in a test's minute
    cfg["data"] = {"synthetic": {"train_samples": 120_000, "eval_samples": 8192}}
    cfg["training"] = {"eval_every": 0, "log_every": 100}
    run = tmp / "run"
    run_rec("train", "--config", str(write_config(tmp / "c.yaml", cfg)), "--run-dir", str(run),
            timeout=900)  # fmt: skip
    return run


def _without(batch: RecBatch, column: int) -> RecBatch:
    """The batch with every sample's bag in `column` emptied."""
    keep = torch.ones(batch.lengths.shape, dtype=torch.bool)
    keep[:, column] = False
    per_id = torch.repeat_interleave(keep.reshape(-1), batch.lengths.reshape(-1).long())
    lengths = batch.lengths.clone()
    lengths[:, column] = 0
    return RecBatch(batch.dense, lengths, batch.values[per_id], batch.labels)


def test_the_sharded_run_is_the_checkpoint_and_reads_the_history(din_run):
    loaded = load_run(din_run)
    cfg = loaded.cfg
    module = FloatReference(loaded.model, cfg.features.sparse, table_rows(cfg))
    batches = list(make_source(cfg, "eval").batches(1024, rank=0, world_size=1, drop_last=False))
    history = cfg.features.sparse.index(cfg.model.history)
    labels = torch.cat([b.labels.float() for b in batches])
    full = verify.quality(score(module, batches), labels)["auc"]
    assert full == pytest.approx(loaded.meta["eval"]["auc"], abs=2e-6)
    assert full > 0.75, full  # a constant is 0.5
    dropped = score(module, [_without(b, history) for b in batches])
    without = verify.quality(dropped, labels)["auc"]
    assert full - without > 0.002, (full, without)  # the attention over the history is used


def test_rec_export_refuses_onnx_for_din(din_run, tmp_path):
    """TorchScript export (tests/serve_cli/test_architectures.py) has the unpooled lookup;
    ONNX does not yet, and says so rather than writing a model without it."""
    proc = rec_in_process("export", str(din_run), "--repo", str(tmp_path / "repo"), "--format",
                          "onnx")  # fmt: skip
    assert proc.returncode == 2, proc.stdout
    assert "model.arch din exports to TorchScript and AOTInductor (aoti) only" in proc.stdout
    assert "Traceback" not in proc.stdout and not (tmp_path / "repo").exists()
