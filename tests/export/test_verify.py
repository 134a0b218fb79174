"""Export's quality summary with several tasks: AUC per task under its name, and the bar held
by every task, not only by their mean."""

from __future__ import annotations

import pytest
import torch

from rec.export import verify


def _labels_and_scores(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(4000, 2, generator=g) < 0.3).float()
    scores = 0.6 * labels + 0.7 * torch.rand(4000, 2, generator=g)  # AUC ~0.9 for both
    return labels, scores


def test_each_task_has_its_auc_and_ratio():
    labels, scores = _labels_and_scores()
    out = verify.summarize({"float": scores, "torchscript": scores}, labels, ["int8"], ["a", "b"])
    ts = out["torchscript"]
    assert set(ts["auc_per_task"]) == {"a", "b"}
    assert ts["auc_per_task"]["a"] == verify.auc(scores[:, 0], labels[:, 0])
    assert ts["auc"] == (ts["auc_per_task"]["a"] + ts["auc_per_task"]["b"]) / 2
    assert ts["auc_ratio_per_task"] == {"a": 1.0, "b": 1.0} and out["quality_bar_passed"]


def test_one_task_under_the_bar_fails_even_if_the_mean_passes():
    labels, scores = _labels_and_scores()
    worse = scores.clone()
    worse[:, 1] += 0.05 * torch.randn(4000, generator=torch.Generator().manual_seed(1))
    better = worse.clone()
    better[:, 0] = labels[:, 0] + 0.01 * scores[:, 0]  # task a perfect: lifts the mean
    out = verify.summarize({"float": scores, "torchscript": better}, labels, ["int8"], ["a", "b"])
    ts = out["torchscript"]
    assert ts["auc_ratio"] >= 0.999  # the mean alone would pass
    assert ts["auc_ratio_per_task"]["b"] < 0.999
    assert not out["quality_bar_passed"]


def test_one_task_reports_no_per_task_breakdown():
    labels, scores = _labels_and_scores()
    out = verify.summarize({"float": scores[:, :1], "torchscript": scores[:, :1]},
                           labels[:, :1], ["int8"], ["label"])  # fmt: skip
    assert "auc_per_task" not in out["torchscript"] and out["quality_bar_passed"]


def test_reduced_precision_is_refused_for_one_task_under_the_bar():
    """dense_dtype bf16 is held to the bar per task, and the refusal names the task."""
    from rec.config import config_from_dict
    from rec.export.pipeline import check_reduced_precision

    cfg = config_from_dict({"model": {"tasks": ["click", "buy"], "over_arch": [16, 2]},
                            "export": {"dense_dtype": "bf16"}})  # fmt: skip
    ev = {"torchscript": {"auc_ratio": 1.0, "auc_ratio_per_task": {"click": 1.01, "buy": 0.99}}}
    with pytest.raises(verify.VerificationError, match=r"0\.99000 on task buy"):
        check_reduced_precision(cfg, ev)
    ev["torchscript"]["auc_ratio_per_task"]["buy"] = 0.9995
    check_reduced_precision(cfg, ev)  # every task at the bar: written
