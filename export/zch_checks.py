"""Export's verification of ZCH tables (docs/zch.md): requests built from the id maps, scored by
every format's reloaded model and by the float model.

- admitted: each ZCH feature sends ids its map holds. The artifact's scores must match the float
  model's within the quantization tolerance of the stored dtype: each id read its own row.
- unknown: the same samples with ids no map holds, twice, with ids of other remainders. Both
  must score exactly the same in the artifact (both read the default row, whatever the id), and
  match the float model reading the default row.

The other features send the same random ids in all three, so only the ZCH ids differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rec.batch import RecBatch
from rec.config import RecConfig
from rec.export import verify
from rec.export.id_maps import TableMap

PROBE_SAMPLES = 64
# Artifact vs float score on the same rows, by the coarsest stored dtype of the model: the
# quantization error of a row (int4: 1/15 of its range, int8: 1/255) through a small head.
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "int8": 5e-2, "int4": 0.25}


@dataclass
class ZchProbe:
    """Three requests of the same samples that differ only in their ZCH features' ids."""

    admitted: RecBatch
    unknown: RecBatch
    unknown_other: RecBatch
    admitted_tables: list[str]
    """The ZCH tables with at least one admitted id (the others send unknown ids in all three)."""

    def batches(self) -> list[RecBatch]:
        return [self.admitted, self.unknown, self.unknown_other]


def _unknown_ids(held: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """n distinct int64 ids none of `held`, negative and huge ones among them."""
    out = torch.empty(0, dtype=torch.int64)
    while out.numel() < n:
        draw = torch.randint(-(2**62), 2**62, (2 * n,), dtype=torch.int64, generator=g)
        out = torch.unique(torch.cat([out, draw[~torch.isin(draw, held)]]))
    return out[torch.randperm(out.numel(), generator=g)[:n]]


def make_probe(cfg: RecConfig, maps: dict[str, TableMap], seed: int = 11) -> ZchProbe | None:
    """The probe requests (one id per feature per sample), None without ZCH tables."""
    if not maps:
        return None
    g = torch.Generator().manual_seed(seed)
    owner = cfg.feature_to_table()
    features = list(cfg.features.sparse)
    b, f = PROBE_SAMPLES, len(features)
    dense = torch.randn(b, cfg.features.dense, generator=g)
    lengths = torch.ones(b, f, dtype=torch.int32)
    base = torch.randint(-(2**62), 2**62, (b, f), dtype=torch.int64, generator=g)
    admitted, unknown, other = base.clone(), base.clone(), base.clone()
    with_ids = []
    for name, m in maps.items():
        held = m.keys[m.used]
        cols = [k for k, feat in enumerate(features) if owner[feat] == name]
        for k in cols:
            unknown[:, k] = _unknown_ids(held, b, g)
            # The next id along: another remainder (rows >= 2), so a modulo reads another row.
            step = torch.ones(b, dtype=torch.int64)
            while bool(torch.isin(unknown[:, k] + step, held).any()):
                step += torch.isin(unknown[:, k] + step, held).to(torch.int64)
            other[:, k] = unknown[:, k] + step
            admitted[:, k] = held[torch.arange(b) % held.numel()] if held.numel() else unknown[:, k]
        if held.numel() and cols:
            with_ids.append(name)
    labels = torch.zeros(b, cfg.model.num_tasks)

    def batch(values: torch.Tensor) -> RecBatch:
        return RecBatch(dense, lengths, values.reshape(-1), labels)

    return ZchProbe(batch(admitted), batch(unknown), batch(other), with_ids)


Scorer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def score_probe(scorer: Scorer, probe: ZchProbe | None) -> dict[str, torch.Tensor]:
    """A format's scores of the probe's three requests ({} without ZCH tables)."""
    if probe is None:
        return {}
    with torch.no_grad():
        return {name: scorer(b.dense, b.lengths, b.values).float()
                for name, b in zip(("admitted", "unknown", "unknown_other"), probe.batches(),
                                   strict=True)}  # fmt: skip


def check(
    probe: ZchProbe, float_scores: dict[str, torch.Tensor], built: dict[str, Any], dtypes: set[str]
) -> dict[str, Any]:
    """rec.json's verification.zch; VerificationError when a format reads a wrong row."""
    tol = max(TOLERANCE[d] for d in dtypes)
    out: dict[str, Any] = {"samples": PROBE_SAMPLES, "tolerance": tol,
                           "tables_with_admitted_ids": probe.admitted_tables}  # fmt: skip
    for fmt, b in built.items():
        got = b.checks["zch_probe"]
        verify.check_identical(
            f"{fmt}: ZCH ids no map holds do not all read the default row: two such requests",
            got["unknown_other"], got["unknown"],
        )  # fmt: skip
        mine = {}
        for name in ("admitted", "unknown"):
            mine[f"{name}_max_abs_diff_vs_float"] = verify.check_close(
                f"{fmt}: ZCH {name} ids, the artifact's scores vs the float model's",
                got[name], float_scores[name], tol,
            )  # fmt: skip
        out[fmt] = mine
    return out
