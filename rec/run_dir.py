"""Contract 1, the run directory: paths and the rules for which checkpoints count.

    <run>/config.yaml, plan.json, metrics.jsonl
    <run>/checkpoints/step_<N>/   .metadata, __<rank>_0.distcp, meta.json, COMMITTED (last)
    <run>/checkpoints/LATEST      name of the newest committed step dir
    <run>/publish.json            with --publish: the run's id and the publisher's generation

Both `rec train --resume` and `rec export` read checkpoints through this module, so a torn
step directory (no COMMITTED) is ignored by both in the same way. The writer is here too
(commit_checkpoint): training and every test or benchmark that makes a run by hand commit a
checkpoint the same way.

The checkpoint's state dict is {"model": <TrainModel state dict>, "optimizer": ..., "train": ...};
model weights are under "model.model.<DLRM key>", e.g.
"model.model.sparse_arch.embedding_bag_collection.embedding_bags.t0.weight".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
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
# The update log publisher's run id and generation (rec.train.publish).
PUBLISH_FILE = "publish.json"
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


def atomic_write(path: Path, text: str) -> None:
    """Writes `text` to `path` durably: a crash leaves either the old file or the whole new one.

    A temp file in the same directory, fsync'd, renamed over `path` (os.replace is atomic), then
    the directory fsync'd so the rename itself survives a power loss.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def commit_checkpoint(run: str | Path, step: int, meta: dict[str, Any]) -> Path:
    """Commits `<run>/checkpoints/step_<step>/`, whose shard files are already on disk.

    Writes meta.json (`meta` with "step" set), then COMMITTED, then points LATEST at the step
    dir, each with atomic_write. The order is the commit protocol: COMMITTED is written only
    once meta.json is durable, and LATEST moves only to a committed dir, so a crash at any
    point leaves either the previous LATEST or a fully committed new checkpoint; a dir without
    COMMITTED is ignored by every reader (committed_steps, latest_checkpoint). Returns the step
    dir. In a multi-rank save, one rank calls this after all ranks' shards are written.
    """
    step_dir = checkpoints_dir(run) / step_dir_name(step)
    if not step_dir.is_dir():
        raise RunDirError(f"cannot commit checkpoint {str(step_dir)!r}: it does not exist")
    meta = {**meta, "step": step}
    atomic_write(step_dir / META_FILE, json.dumps(meta, indent=2) + "\n")
    atomic_write(step_dir / COMMITTED_FILE, f"{time.time()}\n")
    atomic_write(step_dir.parent / LATEST_FILE, step_dir.name + "\n")
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
