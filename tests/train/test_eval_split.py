"""Held-out evaluation with 2 real ranks scores every sample, also when one rank's share of the
split is empty: 100 held-out samples, 128 per rank per batch, so rank 1 gets none and pads."""

from __future__ import annotations

import pytest

from rec import run_dir
from tests.export.conftest import tiny_dict, unsharded_eval
from tests.helpers import run_rec, write_config


def test_a_rank_without_held_out_samples_still_evaluates(tmp_path):
    data = tiny_dict()
    data["data"]["synthetic"]["eval_samples"] = 100
    data["training"]["steps"] = 10
    run = tmp_path / "run"
    run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", data)),
            "--run-dir", str(run))  # fmt: skip
    meta = run_dir.read_meta(run_dir.latest_checkpoint(run))
    q, samples, _ = unsharded_eval(run)
    assert samples == 100
    assert q["auc"] == pytest.approx(meta["eval"]["auc"], abs=2e-6)
    assert q["log_loss"] == pytest.approx(meta["eval"]["log_loss"], abs=2e-6)
