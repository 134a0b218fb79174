"""Verification built into export: quality on held-out data and agreement between formats.

Every check runs on the staged files before they are moved into the repository, so a model that
fails a correctness check never reaches a server. Correctness checks (the file reloaded from
disk, ONNX Runtime against TorchScript) raise VerificationError; the quality bar (exported AUC
against float AUC) is recorded as passed or not and printed, since a deliberate int4 export of
a tiny model may miss it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from rec.batch import RecBatch

# Exported / float AUC: MLPerf DLRM's high-accuracy ratio for 8 bits; int4 gets 99 %.
AUC_RATIO_BAR = {"int8": 0.999, "int4": 0.99, "fp16": 0.999, "fp32": 0.999}
# ONNX Runtime vs TorchScript: same quantized values, other summation order and kernels.
ONNX_TOLERANCE = 1e-4

Scorer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class VerificationError(RuntimeError):
    """An exported artifact does not compute what the in-memory model computes."""


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of one task (ties get their average rank); nan if one class."""
    scores, labels = scores.double().reshape(-1), labels.double().reshape(-1)
    n_pos = float(labels.sum())
    n_neg = labels.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    _, inverse, counts = torch.unique_consecutive(
        sorted_scores, return_inverse=True, return_counts=True
    )
    ends = torch.cumsum(counts, 0).double()
    avg_rank = (ends - (counts.double() - 1) / 2)[inverse]  # 1-based average rank per position
    rank_pos = float((avg_rank * labels[order]).sum())
    return (rank_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def log_loss(scores: torch.Tensor, labels: torch.Tensor) -> float:
    p = scores.double().clamp(1e-7, 1 - 1e-7)
    y = labels.double()
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


def quality(
    scores: torch.Tensor, labels: torch.Tensor, tasks: list[str] | None = None
) -> dict[str, Any]:
    """Mean AUC and log loss over tasks; scores and labels [S, T]. With several tasks, also
    each task's AUC under its name (`tasks`, default task_0, task_1, ...)."""
    aucs = [auc(scores[:, t], labels[:, t]) for t in range(scores.shape[1])]
    out: dict[str, Any] = {"auc": sum(aucs) / len(aucs), "log_loss": log_loss(scores, labels)}
    if len(aucs) > 1:
        names = tasks or [f"task_{t}" for t in range(len(aucs))]
        out["auc_per_task"] = dict(zip(names, aucs, strict=True))
    return out


def score_all(
    scorers: dict[str, Scorer], batches: Iterable[RecBatch]
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Runs every scorer over the same batches; returns their scores [S, T] and the labels."""
    outs: dict[str, list[torch.Tensor]] = {name: [] for name in scorers}
    labels = []
    with torch.no_grad():
        for b in batches:
            for name, fn in scorers.items():
                outs[name].append(fn(b.dense, b.lengths, b.values).float())
            labels.append(b.labels.float())
    if not labels:
        raise VerificationError("the held-out split yielded no batches to verify with")
    return {k: torch.cat(v) for k, v in outs.items()}, torch.cat(labels)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def check_identical(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got, want):
        raise VerificationError(
            f"{name} differs from the in-memory model (max diff {max_diff(got, want):g})"
        )


def check_close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> float:
    diff = max_diff(got, want)
    if not diff <= tol:  # also catches nan
        raise VerificationError(f"{name}: max abs difference {diff:g} exceeds {tol:g}")
    return diff


def summarize(
    scores: dict[str, torch.Tensor],
    labels: torch.Tensor,
    dtypes: Iterable[str],
    tasks: list[str] | None = None,
) -> dict[str, Any]:
    """Quality of every scorer, the exported/float AUC ratio and the quality bar.

    `scores` has "float" and the exported formats ("torchscript", "onnx"), same samples. With
    several tasks the bar holds for each task's AUC ratio, not just for their mean.
    """
    bar = min(AUC_RATIO_BAR[d] for d in dtypes)
    out: dict[str, Any] = {"eval_samples": int(labels.shape[0]), "auc_ratio_bar": bar}
    base = quality(scores["float"], labels, tasks)
    out["float"] = base
    passed = True
    for fmt, s in scores.items():
        if fmt == "float":
            continue
        q = quality(s, labels, tasks)
        q["auc_ratio"] = _ratio(q["auc"], base["auc"])
        ratios = [q["auc_ratio"]]
        if "auc_per_task" in q:
            q["auc_ratio_per_task"] = {
                name: _ratio(value, base["auc_per_task"][name])
                for name, value in q["auc_per_task"].items()
            }
            ratios += q["auc_ratio_per_task"].values()
        q["max_abs_diff_vs_float"] = max_diff(s, scores["float"])
        passed = passed and all(r >= bar for r in ratios)
        out[fmt] = q
    out["quality_bar_passed"] = passed
    return out


def _ratio(value: float, base: float) -> float:
    return value / base if base else math.nan
