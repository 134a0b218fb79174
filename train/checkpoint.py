"""The checkpointer: interval, retention and atomicity of torch.distributed.checkpoint saves.

A save is a collective. Every rank writes its own shard file into `step_<N>/`; after the last
one is on disk, rank 0 writes meta.json, then COMMITTED, then points LATEST at it
(rec.run_dir.commit_checkpoint), then deletes checkpoints beyond `keep_last`. A crash at any
point leaves either the previous LATEST or a fully committed new one; the torn directory has no
COMMITTED and every reader ignores it (rec.run_dir).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_local_load_plan,
)

from rec import run_dir
from rec.config import CheckpointConfig


class CheckpointError(RuntimeError):
    """A checkpoint could not be read; the message names the directory and the cause."""


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class NoCopySavePlanner(DefaultSavePlanner):
    """DCP's default save plan, without a second copy of the tables in memory while saving.

    A rank's tables are views into one flat FBGEMM TBE buffer. DCP's file writer clones every
    tensor whose storage is larger than the tensor itself (so torch.save writes only its bytes)
    and keeps all the clones until the rank's file is complete: a second copy of the rank's
    whole share of the tables (at Criteo Kaggle size the largest rank peaked at 8.9 GB; 5.89 GB
    without the copy).
    Handed instead a tensor over the same memory whose storage is exactly its bytes (through
    numpy, which shares it), the writer copies nothing. The files are the same. This relies on
    the save being synchronous (dcp.save): an async save would write while training changes
    the tables, which is what DCP's clone protects against.
    """

    def resolve_data(self, write_item):
        data = super().resolve_data(write_item)
        if isinstance(data, torch.Tensor):
            data = _own_storage(data.detach())
        return data


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """`t` itself, or a tensor over the same memory whose storage is exactly `t`'s bytes."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.untyped_storage().nbytes() == t.nbytes:
        return t
    try:
        return torch.from_numpy(t.numpy())
    except TypeError:  # a dtype numpy lacks (bfloat16): DCP clones it, as before
        return t


# A table's weight in the state dict: "model.<param>" with <param> ending in
# "embedding_bags.<table>.weight" (EmbeddingBagCollection) or "embeddings.<table>.weight"
# (din's EmbeddingCollection); its optimizer state: "optimizer.state.<param>.<...>".
_TABLE_WEIGHT = re.compile(r"^model\.(.+\.(?:embedding_bags|embeddings)\.([^.]+)\.weight)$")


class FreshOptimizerStateLoadPlanner(DefaultLoadPlanner):
    """DCP's load plan, where a table's optimizer state that the checkpoint lacks starts fresh.

    The plan decides which optimizer trains a table. A `data_parallel` table is a plain
    replicated parameter, trained by the dense optimizer (its state: Adam's exp_avg, ... under
    "optimizer.state.<param>.exp_avg"); any other type puts it in FBGEMM's kernel with the fused
    embedding optimizer (row-wise Adagrad's "optimizer.state.<param>.<table>.momentum1"). A
    resume whose plan differs (--publish keeps tables to whole-row shards; another world size or
    sharding) so finds no state of the new kind for such a table: its rows load as saved, its
    new optimizer starts as at a run's start, as it would on a change of optimizer. Any other
    key the checkpoint lacks still fails the load (DCP's "Missing key in checkpoint")."""

    def __init__(self) -> None:
        super().__init__()
        self.fresh_tables: set[str] = set()

    def create_local_plan(self):
        assert self.metadata is not None
        saved = self.metadata.state_dict_metadata
        params = {m.group(1): m.group(2) for k in saved if (m := _TABLE_WEIGHT.match(k))}
        prefix = "optimizer.state."
        for key in [k for k in self.state_dict if k not in saved and k.startswith(prefix)]:
            rest = key[len(prefix) :]
            table = next((t for p, t in params.items() if rest.startswith(p + ".")), None)
            if table is not None:
                del self.state_dict[key]
                self.fresh_tables.add(table)
        # DefaultLoadPlanner's own create_local_plan would take a checkpoint holding keys this
        # state lacks (the table's other optimizer state) for a pre-2.4 one and re-flatten the
        # state with the dropped keys back in; rec's checkpoints are all 2.4's layout.
        return create_default_local_load_plan(self.state_dict, self.metadata, strict=True)


class Checkpointer:
    """Saves and loads the whole training state of one run directory."""

    def __init__(self, run: str | Path, cfg: CheckpointConfig, rank: int) -> None:
        self.root = run_dir.checkpoints_dir(run)
        self.cfg = cfg
        self.rank = rank

    def due(self, step: int) -> bool:
        return self.cfg.every_steps > 0 and step > 0 and step % self.cfg.every_steps == 0

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any],
             rank_files: Callable[[Path], None] | None = None) -> Path:  # fmt: skip
        """Writes `state` at `step` (all ranks call this), and each rank's own files
        (`rank_files(step_dir)`) before the commit. Returns the committed step dir."""
        step_dir = self.root / run_dir.step_dir_name(step)
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if step_dir.exists():  # a torn or older save of the same step: replace it whole
                shutil.rmtree(step_dir)
        _barrier()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=str(step_dir), planner=NoCopySavePlanner())
        if rank_files is not None:
            rank_files(step_dir)
        _barrier()
        files = _digests(step_dir)
        if self.rank == 0:
            meta = {**meta, "step": step, "save_seconds": round(time.perf_counter() - t0, 3),
                    "files": files}  # fmt: skip
            run_dir.commit_checkpoint(self.root.parent, step, meta)
            self._prune()
        _barrier()
        return step_dir

    def _prune(self) -> None:
        committed = run_dir.committed_steps(self.root.parent)
        for old in committed[: -self.cfg.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def latest(self) -> Path | None:
        return run_dir.latest_checkpoint(self.root.parent)

    @staticmethod
    def load(step_dir: Path, state: dict[str, Any]) -> list[str]:
        """Loads `step_dir` into `state` in place, resharding to the current world size and plan.

        Returns the tables whose optimizer state started fresh, over all ranks: the new plan
        trains them with the other optimizer (FreshOptimizerStateLoadPlanner).
        Raises rec.run_dir.CorruptCheckpointError naming a damaged shard, CheckpointError else.
        """
        run_dir.verify_checkpoint(step_dir)
        planner = FreshOptimizerStateLoadPlanner()
        try:
            dcp.load(state, checkpoint_id=str(step_dir), planner=planner)
        # DCP's CheckpointException derives from BaseException, not Exception.
        except (Exception, CheckpointException) as e:
            failures = getattr(e, "failures", None)  # rank -> the exception that rank hit
            cause = next(iter(failures.values())) if failures else e
            raise CheckpointError(
                f"cannot load checkpoint {str(step_dir)!r}: {type(cause).__name__}: {cause}"
            ) from e
        fresh = [planner.fresh_tables]
        if dist.is_initialized():  # a rank sees only the tables it holds shards of
            fresh = [set() for _ in range(dist.get_world_size())]
            dist.all_gather_object(fresh, planner.fresh_tables)
        return sorted(set().union(*fresh))


def _digests(step_dir: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every checkpoint file; the ranks hash a share each, in parallel."""
    files = run_dir.shard_files(step_dir)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = {p.name: run_dir.file_digest(p) for p in files[rank::world]}
    if world == 1:
        return mine
    gathered: list[dict[str, Any]] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, mine)
    return {k: v for part in gathered for k, v in part.items()}
