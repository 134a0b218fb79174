"""Run directories with ZCH tables and hand-made id maps (no training): the checkpoint holds
state["zch"][table]["keys" / "used"] as rec train writes it (rec.zch.IdMap.state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from rec import run_dir, zch
from rec.config import config_from_dict
from rec.contract.sections import ZCH_MAP_LAYOUT
from rec.model import TrainModel, build_model
from tests.export.conftest import tiny_dict

I64 = torch.iinfo(torch.int64)


def zch_dict(**export: Any) -> dict[str, Any]:
    """tiny_dict with two ZCH tables: t0 (feature a) and t1, which features b and c share."""
    data = tiny_dict(**export)
    for table in data["tables"][:2]:
        table["ids"] = {"zch": {"probes": 4, "admit_after": 2, "eviction": "lru"}}
    return data


def admitted_ids(rows: int, seed: int = 0) -> list[int]:
    """Ids to admit: three of one remainder (mod rows), int64's extremes, and random ones."""
    g = torch.Generator().manual_seed(seed)
    random = torch.randint(-(2**62), 2**62, (30,), generator=g).tolist()
    return [5, 5 + rows, 5 + 2 * rows, -7, I64.max, I64.min, 2**62 + 3, *random]


def hand_made_map(slots: int, probes: int, ids: list[int],
                  strict: bool = True) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(keys, used): each id at the first free slot of its window (rec.zch.windows); an id whose
    window is full fails (strict) or is left out."""
    keys = torch.zeros(slots, dtype=torch.int64)
    used = torch.zeros(slots, dtype=torch.bool)
    for i in ids:
        for slot in zch.windows(torch.tensor([i]), slots, probes)[0].tolist():
            if not used[slot]:
                keys[slot], used[slot] = i, True
                break
        else:
            if strict:
                raise AssertionError(f"id {i}'s window is full")
    return keys, used


Map = tuple[torch.Tensor, torch.Tensor]


def write_zch_run(run: Path, data: dict[str, Any] | None = None, seed: int = 0,
                  maps: dict[str, Map] | None = None) -> Path:  # fmt: skip
    """A run dir with one committed checkpoint of a seeded model and its ZCH tables' maps
    (hand-made from admitted_ids unless `maps` gives them)."""
    cfg = config_from_dict(data or zch_dict())
    torch.manual_seed(seed)
    model = TrainModel(build_model(cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)  # larger than the default init, so a wrong row shows
    if maps is None:
        maps = {t.name: hand_made_map(t.zch.slots, t.zch.probes, admitted_ids(t.rows, i))
                for i, t in enumerate(cfg.tables) if t.zch is not None}  # fmt: skip
    state = {"model": model.state_dict(),
             "zch": {name: {"keys": k, "used": u} for name, (k, u) in maps.items()}}  # fmt: skip
    step = run_dir.checkpoints_dir(run) / "step_10"
    dcp.save(state, checkpoint_id=str(step))
    run_dir.commit_checkpoint(run, 10, {"world_size": 1, zch.CHECKPOINT_LAYOUT_KEY: ZCH_MAP_LAYOUT})
    (run / run_dir.CONFIG_FILE).write_text(cfg.to_yaml())
    return run
