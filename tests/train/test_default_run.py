"""The README's main job: `rec train` with no config, on 2 ranks, learns the planted signal."""

import json

from rec import run_dir
from tests.helpers import run_rec, warning_lines


def test_default_run_reaches_auc_above_0_70(tmp_path):
    run = tmp_path / "run"
    out = run_rec("train", "--run-dir", str(run), timeout=900).stdout
    assert "checkpoint committed" in out
    assert not warning_lines(out), warning_lines(out)  # the README's run prints only rec's lines
    latest = run_dir.latest_checkpoint(run)
    assert latest is not None
    meta = run_dir.read_meta(latest)
    assert meta["world_size"] == 2
    assert meta["eval"]["auc"] > 0.70, meta["eval"]
    evals = [json.loads(x) for x in (run / run_dir.METRICS_FILE).read_text().splitlines()]
    evals = [e for e in evals if e["kind"] == "eval"]
    # It learned during the run, not only by the end: the first evaluation is below the last.
    assert evals[0]["auc"] < evals[-1]["auc"]
    assert (run / "training_curve.png").stat().st_size > 10_000
