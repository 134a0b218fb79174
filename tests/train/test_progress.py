"""The training curve of a run no longer than training.eval_every: one evaluation, said so."""

from __future__ import annotations

import json

from rec.train.progress import plot_metrics, single_eval_note


def _metrics(path, eval_steps: list[int]):
    records = [{"kind": "train", "step": s, "loss": 0.7 - s / 1000} for s in (10, 20, 30)]
    records += [{"kind": "eval", "step": s, "auc": 0.6 + s / 1000, "log_loss": 0.6}
                for s in eval_steps]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_run_with_one_evaluation_says_why_its_curve_is_a_point(tmp_path):
    metrics = _metrics(tmp_path / "metrics.jsonl", [30])
    evals = [r for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "eval"]
    note = single_eval_note(evals)
    assert note == (
        "one evaluation (AUC 0.6300 at step 30):\n"
        "set training.eval_every below training.steps for a curve"
    )
    assert plot_metrics(metrics, tmp_path / "curve.png").stat().st_size > 10_000


def test_a_curve_has_no_note():
    evals = [{"kind": "eval", "step": s, "auc": 0.6} for s in (10, 20)]
    assert single_eval_note(evals) is None
