"""training.pipeline: base (TorchRec's TrainPipelineBase) over several segments. It stays
stopped once an iterator ends, so without a reset per segment a run ended silently at its first
evaluation, reporting success with a third of its steps."""

from __future__ import annotations

import copy
import json

from tests.helpers import TINY, run_rec, write_config


def test_the_plain_pipeline_trains_every_step_across_evaluations_and_checkpoints(tmp_path):
    cfg = copy.deepcopy(TINY)
    cfg["training"].update(pipeline="base", steps=12, eval_every=4, log_every=4, profile_steps=0)
    cfg["checkpoint"] = {"every_steps": 6, "keep_last": 3}
    run = tmp_path / "run"
    out = run_rec("train", "-c", str(write_config(tmp_path / "c.yaml", cfg)),
                  "--run-dir", str(run)).stdout  # fmt: skip
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [4, 8, 12], out
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_12"
