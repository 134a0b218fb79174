"""Export of real 2-rank `rec train` runs: every sharding type, and the quality bar."""

from __future__ import annotations

import json

import pytest
import torch

from rec.contract.repository import manifest_in, model_file_in
from rec.export.build import score
from rec.export.pipeline import eval_batches, export_run, resolve_config
from rec.metrics import quality
from tests.export.conftest import SHARDINGS, unsharded_eval

quiet = {"log": lambda _: None}


@pytest.mark.parametrize("layout", sorted(SHARDINGS))
def test_sharded_checkpoint_loads_the_trained_model(trained_runs, layout):
    """The unsharded float model scores the held-out split exactly as the sharded trainer did,
    every sample of it (1,850: the trainer's last batches are padded, not dropped)."""
    run = trained_runs[layout]
    plan = json.loads((run / "plan.json").read_text())
    assert [t["sharding_type"] for t in plan["tables"]] == SHARDINGS[layout]
    q, samples, loaded = unsharded_eval(run)
    assert samples == 1850
    trainer = loaded.meta["eval"]
    assert q["auc"] == pytest.approx(trainer["auc"], abs=2e-6)
    assert q["log_loss"] == pytest.approx(trainer["log_loss"], abs=2e-6)
    assert trainer["auc"] > 0.55  # it did learn something


@pytest.mark.parametrize(("quantize", "bar"), [("int8", 0.999), ("int4", 0.99)])
def test_quality_bar(trained_runs, tmp_path, quantize, bar):
    run = trained_runs["tw_rw_cw_dp"]
    result = export_run(run, tmp_path / "repo", quantize=quantize, **quiet)
    manifest = json.loads(manifest_in(result.models["torchscript"]).read_text())
    ev = manifest["verification"]["eval"]
    assert ev["auc_ratio_bar"] == bar
    assert ev["torchscript"]["auc_ratio"] >= bar
    assert ev["quality_bar_passed"] is True
    assert ev["float"]["auc"] == pytest.approx(
        manifest["source"]["eval_at_checkpoint"]["auc"], abs=2e-6
    )
    # The repository's model.pt, loaded as a server would, scores the held-out split as the
    # export's verification recorded: the recorded numbers are of this file.
    scripted = torch.jit.load(str(model_file_in(result.models["torchscript"])))
    batches = list(eval_batches(resolve_config(run, quantize, None, None), quiet["log"]))
    labels = torch.cat([b.labels.float() for b in batches])
    q = quality(score(scripted, batches), labels)
    assert ev["eval_samples"] == labels.shape[0] == 1850
    assert q["auc"] == pytest.approx(ev["torchscript"]["auc"], abs=1e-9)
    assert q["log_loss"] == pytest.approx(ev["torchscript"]["log_loss"], abs=1e-9)
