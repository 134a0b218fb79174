"""Contract 1, the run directory: paths and the rules for which checkpoints count.

    <run>/config.yaml, plan.json, metrics.jsonl
    <run>/checkpoints/step_<N>/   .metadata, __<rank>_0.distcp, meta.json, COMMITTED (last)
    <run>/checkpoints/LATEST      name of the newest committed step dir

Both `rec train --resume` and `rec export` read checkpoints through this module, so a torn
step directory (no COMMITTED) is ignored by both in the same way.

The checkpoint's state dict is {"model": <TrainModel state dict>, "optimizer": ..., "train": ...};
model weights are under "model.model.<DLRM key>", e.g.
"model.model.sparse_arch.embedding_bag_collection.embedding_bags.t0.weight".
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"  # TensorBoard event files: `tensorboard --logdir <run>`
CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "LATEST"
COMMITTED_FILE = "COMMITTED"
META_FILE = "meta.json"
_STEP_RE = re.compile(r"^step_(\d+)$")


class RunDirError(FileNotFoundError):
    """The run directory or a checkpoint in it is missing or incomplete."""


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def checkpoints_dir(run: str | Path) -> Path:
    return Path(run) / CHECKPOINTS_DIR


def is_committed(step_dir: Path) -> bool:
    return (step_dir / COMMITTED_FILE).is_file()


def committed_steps(run: str | Path) -> list[Path]:
    """Committed step directories, oldest first."""
    root = checkpoints_dir(run)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and p.is_dir() and is_committed(p):
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(run: str | Path) -> Path | None:
    """The newest committed step dir: LATEST if it names a committed one, else the newest found."""
    root = checkpoints_dir(run)
    latest = root / LATEST_FILE
    if latest.is_file():
        candidate = root / latest.read_text().strip()
        if candidate.is_dir() and is_committed(candidate):
            return candidate
    steps = committed_steps(run)
    return steps[-1] if steps else None


def resolve_checkpoint(run: str | Path, checkpoint: str | None = None) -> Path:
    """The checkpoint to read: `checkpoint` (a step dir name or path) or the latest committed.

    Raises RunDirError naming what is missing.
    """
    run = Path(run)
    if not run.is_dir():
        raise RunDirError(f"run directory {str(run)!r} does not exist")
    if not (run / CONFIG_FILE).is_file():
        raise RunDirError(f"{str(run)!r} is not a run directory: it has no {CONFIG_FILE}")
    if checkpoint is None:
        found = latest_checkpoint(run)
        if found is None:
            raise RunDirError(f"run directory {str(run)!r} has no committed checkpoint")
        return found
    step_dir = Path(checkpoint)
    if not step_dir.is_absolute() and not step_dir.exists():
        step_dir = checkpoints_dir(run) / checkpoint
    if not step_dir.is_dir():
        raise RunDirError(f"checkpoint {str(step_dir)!r} does not exist")
    if not is_committed(step_dir):
        raise RunDirError(
            f"checkpoint {str(step_dir)!r} has no {COMMITTED_FILE} marker: it is incomplete "
            "(the run stopped while writing it)"
        )
    return step_dir


def read_meta(step_dir: Path) -> dict[str, Any]:
    return json.loads((Path(step_dir) / META_FILE).read_text())


class CorruptCheckpointError(RunDirError):
    """A shard file of a committed checkpoint is missing, truncated or altered."""


def shard_files(step_dir: Path) -> list[Path]:
    """The files a torch.distributed.checkpoint directory consists of (.metadata and shards)."""
    step_dir = Path(step_dir)
    return sorted([*step_dir.glob("*.distcp"), step_dir / ".metadata"])


def file_digest(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"bytes": path.stat().st_size, "sha256": h.hexdigest()}


def verify_checkpoint(step_dir: Path) -> None:
    """Checks every shard against the sizes and digests recorded in meta.json at save time.

    torch.distributed.checkpoint stores no checksums, and a truncated shard otherwise fails
    deep inside torch.load with "failed finding central directory", naming no file.
    Raises CorruptCheckpointError naming the file.
    """
    step_dir = Path(step_dir)
    recorded = read_meta(step_dir).get("files") if (step_dir / META_FILE).is_file() else None
    if not recorded:
        return  # written before digests were recorded: nothing to compare against
    for name, want in recorded.items():
        path = step_dir / name
        if not path.is_file():
            raise CorruptCheckpointError(f"checkpoint shard {str(path)!r} is missing")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise CorruptCheckpointError(
                f"checkpoint shard {str(path)!r} has {size} bytes, {want['bytes']} were written "
                "(truncated or replaced)"
            )
        if file_digest(path)["sha256"] != want["sha256"]:
            raise CorruptCheckpointError(
                f"checkpoint shard {str(path)!r} does not match the sha256 recorded when it was "
                "written (corrupted)"
            )
