"""Evaluation metrics, names and computation, in one place: training's evaluation (logged to
metrics.jsonl and the checkpoint's meta.json), export's verification (rec.json) and
`rec predict` all call `quality` and use these names, so one number has one name everywhere.

    auc           mean over tasks of each task's ROC AUC (ties get their average rank)
    log_loss      binary cross-entropy of the probabilities, mean over samples and tasks
    auc_per_task  {task name: AUC} when there are several tasks (rec.json, `rec predict`)
    auc_<task>    the same, flat, in training's logs (`flat`)

Example:
    >>> import torch
    >>> quality(torch.tensor([[0.9], [0.2], [0.6]]), torch.tensor([[1.0], [0.0], [0.0]]))["auc"]
    1.0
"""

from __future__ import annotations

import math
from typing import Any

import torch

AUC = "auc"
LOG_LOSS = "log_loss"
AUC_PER_TASK = "auc_per_task"
# Probabilities are clamped this far from 0 and 1 before the log: a confident wrong score
# costs -log(1e-7) = 16.1, not infinity.
PROB_EPS = 1e-7


def task_auc_name(task: str) -> str:
    """The flat name of one task's AUC in training's logs."""
    return f"{AUC}_{task}"


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
    """Mean binary cross-entropy of probabilities `scores` against 0/1 `labels`."""
    p = scores.double().clamp(PROB_EPS, 1 - PROB_EPS)
    y = labels.double()
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


def quality(
    scores: torch.Tensor, labels: torch.Tensor, tasks: list[str] | None = None
) -> dict[str, Any]:
    """Mean AUC and log loss over tasks; scores (probabilities) and labels [S, T]. With several
    tasks, also each task's AUC under its name (`tasks`, default task_0, task_1, ...)."""
    if scores.dim() == 1:
        scores, labels = scores.reshape(-1, 1), labels.reshape(-1, 1)
    aucs = [auc(scores[:, t], labels[:, t]) for t in range(scores.shape[1])]
    out: dict[str, Any] = {AUC: sum(aucs) / len(aucs), LOG_LOSS: log_loss(scores, labels)}
    if len(aucs) > 1:
        names = tasks or [f"task_{t}" for t in range(len(aucs))]
        out[AUC_PER_TASK] = dict(zip(names, aucs, strict=True))
    return out


def flat(q: dict[str, Any]) -> dict[str, float]:
    """`quality`'s result with auc_per_task spread into auc_<task> keys (a log line's form)."""
    out = {AUC: q[AUC]}
    out.update({task_auc_name(t): v for t, v in q.get(AUC_PER_TASK, {}).items()})
    out[LOG_LOSS] = q[LOG_LOSS]
    return out
