"""Held-out evaluation with 2 real ranks scores every sample, also when one rank's share of the
split is empty: 100 held-out samples, 128 per rank per batch, so rank 1 gets none and pads."""

from __future__ import annotations

import pytest

from rec import run_dir
from rec.data import make_source
from rec.export import verify
from rec.export.load import load_run
from rec.export.module import ServingModule
from rec.model import table_rows
from tests.export.conftest import tiny_dict
from tests.helpers import run_rec, write_config


def test_a_rank_without_held_out_samples_still_evaluates(tmp_path):
    data = tiny_dict()
    data["data"]["synthetic"]["eval_samples"] = 100
    data["training"]["steps"] = 10
    run = tmp_path / "run"
    run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", data)),
            "--run-dir", str(run))  # fmt: skip
    meta = run_dir.read_meta(run_dir.latest_checkpoint(run))
    loaded = load_run(run)
    module = ServingModule(loaded.model, loaded.cfg.features.sparse, table_rows(loaded.cfg))
    batches = make_source(loaded.cfg, "eval").batches(512, rank=0, world_size=1, drop_last=False)
    scores, labels = verify.score_all({"float": module}, batches)
    assert labels.shape[0] == 100
    q = verify.quality(scores["float"], labels)
    assert q["auc"] == pytest.approx(meta["eval"]["auc"], abs=2e-6)
    assert q["log_loss"] == pytest.approx(meta["eval"]["logloss"], abs=2e-6)
