"""The model repository the serving tests serve: written by the real `rec export`.

A tiny seeded (untrained) checkpoint is written the way the trainer writes one (Contract 1,
docs/architecture.md#run-directory; committed by rec.run_dir.commit_checkpoint), then
`rec.export.pipeline.export_run` turns it into Contract 2: an int8 FBGEMM TorchScript model.pt,
config.pbtxt and rec.json. This is the one place serving tests get a repository from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from rec import run_dir
from rec.config import config_from_dict
from rec.model import TrainModel, build_model

# Two tasks and a shared table, so scores are [B, 2] and the feature order is not table order.
TINY: dict[str, Any] = {
    "tables": [
        {"name": "t0", "rows": 300, "dim": 8, "features": ["user"]},
        {"name": "t1", "rows": 120, "dim": 8, "features": ["item", "tags"]},
        {"name": "t2", "rows": 50, "dim": 8, "features": ["city"], "pooling": "mean"},
    ],
    "features": {"dense": 4, "sparse": ["item", "user", "tags", "city"]},
    "model": {"dense_arch": [16, 8], "over_arch": [16, 2]},
    "data": {"synthetic": {"train_samples": 4096, "eval_samples": 1024}},
    "training": {"batch_size": 128, "steps": 10, "eval_every": 0, "log_every": 10},
    "checkpoint": {"every_steps": 0},
    "export": {"max_batch_size": 256, "format": "torchscript"},
}
NUM_DENSE, NUM_SPARSE, NUM_TASKS, MAX_BATCH_SIZE = 4, 4, 2, 256


def write_seeded_run(run: Path, data: dict[str, Any] = TINY, seed: int = 0) -> Path:
    """A run dir with one committed checkpoint (step_10) of a seeded, untrained model."""
    cfg = config_from_dict(data)
    torch.manual_seed(seed)
    model = TrainModel(build_model(cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)  # spread the scores so mismatches between servers would show
    step = run_dir.checkpoints_dir(run) / run_dir.step_dir_name(10)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(step))
    run_dir.commit_checkpoint(run, 10, {"world_size": 1})
    (run / run_dir.CONFIG_FILE).write_text(cfg.to_yaml())
    return run


def write_tiny_repository(repo: Path, work: Path) -> Path:
    """Exports a seeded tiny run (kept under `work`) into `repo`; returns the model directory."""
    from rec.export.pipeline import export_run

    run = write_seeded_run(work / "run")
    result = export_run(run, repo, log=lambda _msg: None)
    return result.models["torchscript"].parent
