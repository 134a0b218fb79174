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

from rec.contract import EMBEDDING_DTYPES
from rec.metrics import AUC, AUC_PER_TASK, auc, log_loss, quality

__all__ = ["auc", "log_loss", "quality"]  # the metrics live in rec.metrics; these names stay

# Exported / float AUC per embedding dtype (rec.contract).
AUC_RATIO_BAR = {name: d.auc_ratio_bar for name, d in EMBEDDING_DTYPES.items()}
# ONNX Runtime vs TorchScript: same quantized values, other summation order and kernels.
ONNX_TOLERANCE = 1e-4
# The AOTInductor package vs the module it was exported from: the same ops on the same values,
# but Inductor fuses the elementwise ones and the small reductions into loops of its own: the
# dense transform's log1p and the sigmoid through SLEEF's vectorized functions where ATen calls
# libm (an ulp or two each), and MMoE's softmax gates summed in its vector order. Measured on
# the tests' models: 0 (dlrm_dcn, dcn_v2) to 1.2e-7 (dlrm) and 1.7e-6 (mmoe). rec.json stores
# the difference of each export; this bound only catches a package that computes something
# else. Batching is held to exactly 0 separately.
AOTI_TOLERANCE = 1e-5

Scorer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class VerificationError(RuntimeError):
    """An exported artifact does not compute what the in-memory model computes."""


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
        q["auc_ratio"] = _ratio(q[AUC], base[AUC])
        ratios = [q["auc_ratio"]]
        if AUC_PER_TASK in q:
            q["auc_ratio_per_task"] = {
                name: _ratio(value, base[AUC_PER_TASK][name])
                for name, value in q[AUC_PER_TASK].items()
            }
            ratios += q["auc_ratio_per_task"].values()
        q["max_abs_diff_vs_float"] = max_diff(s, scores["float"])
        passed = passed and all(r >= bar for r in ratios)
        out[fmt] = q
    out["quality_bar_passed"] = passed
    return out


def _ratio(value: float, base: float) -> float:
    return value / base if base else math.nan
