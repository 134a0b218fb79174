"""Where the trainer's batches come from: the interface of a batch source, which Trainer.fit's
one loop drives, and the file source (epochs over the training split). The stream source
(rec.train.stream_loop) is the other one.

The loop trains in segments between drained boundaries (evaluations, checkpoints, ZCH rounds,
the end): it asks the source for a segment of at most `limit` batches, calls `after_step` for
each step the pipeline completes (the pipeline reads ahead, so a source that must know which
batch a step trained keeps its yielded batches in order and takes one per step), `report`
every training.log_every steps, and at each boundary `should_stop`, `checkpoint_due` and, after
a committed checkpoint, `after_checkpoint`.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torchrec.datasets.utils import Batch

from rec.batch import RecBatch
from rec.config import RecConfig
from rec.data import make_source
from rec.train.distributed import DistContext, all_mean
from rec.train.progress import Progress, log

ToTorchrec = Callable[[RecBatch], Batch]
"""A training batch as the model takes it (the trainer's keys, table rows and ZCH remap)."""


@dataclass
class Position:
    """Where training stands: optimiser steps done, and the data position of the next sample."""

    step: int = 0
    epoch: int = 0
    offset: int = 0  # global samples of `epoch` already consumed

    def as_tensors(self) -> dict[str, torch.Tensor]:
        return {k: torch.tensor(getattr(self, k), dtype=torch.int64) for k in self.__dict__}


class BatchSource(Protocol):
    """What Trainer.fit needs from where its batches come from (module docstring). Every hook
    is called on every rank at the same step; those marked collective must be."""

    online: bool
    """It scores its own batches as it trains and reports their quality with each window's
    line (progressive validation): ZCH summaries then go with those lines."""

    def total_steps(self, pos: Position) -> int | None:
        """The step this run ends at, None for no end but a stop (should_stop)."""

    def resume(self, step_dir: Path) -> None:
        """After Trainer.resume loaded `step_dir`: what the source keeps there (meta.json)."""

    def start(self, pos: Position, progress: Progress | None) -> None:
        """Before the first segment: opens what it reads and says so (rank 0: `progress`)."""

    def segment(self, limit: int) -> Iterator[Batch]:
        """Up to `limit` batches; fewer when the data ends or the source ends the segment."""

    def after_step(self, pos: Position, loss: torch.Tensor, logits: torch.Tensor,
                   labels: torch.Tensor) -> None:  # fmt: skip
        """Step `pos.step` trained the oldest batch not yet accounted for."""

    def report(self, step: int, lr: float) -> dict[str, float] | None:
        """The window's line and metrics.jsonl records (collective); the quality it measured,
        if any, which the next checkpoint's meta.json holds."""

    def should_stop(self) -> str | None:
        """At a boundary (collective agreement already reached): why the run stops here, or
        None to go on. The run checkpoints before it stops."""

    def checkpoint_due(self, step: int) -> bool:
        """At a boundary: the source wants a checkpoint here (besides checkpoint.every_steps)."""

    def after_checkpoint(self, step: int) -> None:
        """A checkpoint of `step` is committed."""

    def meta(self) -> dict[str, Any]:
        """Its part of the checkpoint's meta.json (collective)."""

    def write_files(self, step_dir: Path) -> None:
        """This rank's own files in a checkpoint being written (before it commits)."""

    def close(self) -> None:
        """The run ended or failed: releases what the source holds."""

    def ended(self, first_step: int, step: int) -> None:
        """After a run that began at `first_step` stopped at `step` and closed: raises when
        that outcome is a failure the exit code must say (every rank alike)."""


class FileEpochs:
    """Epochs over the training split (data.*), from the position a resume gives: each rank
    reads its share of every global batch."""

    online = False

    def __init__(self, cfg: RecConfig, ctx: DistContext, to_torchrec: ToTorchrec) -> None:
        self.cfg, self.ctx, self.to_torchrec = cfg, ctx, to_torchrec
        self.batch_size = cfg.training.batch_size
        self.global_batch = self.batch_size * ctx.world_size
        self.train = make_source(cfg, "train")
        self.positions: deque[tuple[int, int]] = deque()
        """(epoch, offset) after each batch yielded and not yet trained, oldest first."""
        self.batches: Iterator[Batch] = iter(())
        self.ran_out = False
        self.planned = 0
        self.progress: Progress | None = None
        self.loss_sum, self.loss_n = 0.0, 0

    def total_steps(self, pos: Position) -> int:
        t = self.cfg.training
        if t.steps:
            return t.steps
        per_epoch = self.train.num_samples() // self.global_batch
        if per_epoch == 0:
            raise ValueError(
                f"the training data has {self.train.num_samples()} samples, fewer than "
                f"one global batch ({self.batch_size} x {self.ctx.world_size} ranks)"
            )
        left_now = (self.train.num_samples() - pos.offset) // self.global_batch
        return pos.step + left_now + per_epoch * (t.epochs - pos.epoch - 1)

    def resume(self, step_dir: Path) -> None:
        """Nothing of its own: the position is the trainer's (Position)."""

    def start(self, pos: Position, progress: Progress | None) -> None:
        self.progress = progress
        self.batches = self._epochs(pos.epoch, pos.offset)
        self.planned = self.total_steps(pos)
        if progress:
            log(f"training {self.planned} steps, {self.ctx.world_size} ranks x "
                f"batch {self.batch_size}")  # fmt: skip

    def _epochs(self, epoch: int, offset: int) -> Iterator[Batch]:
        """Batches from (epoch, offset) on, across epochs; records where each one ends."""
        while self.cfg.training.steps or epoch < self.cfg.training.epochs:
            for batch in self.train.batches(
                self.batch_size, self.ctx.rank, self.ctx.world_size, start=offset
            ):
                offset += self.global_batch
                self.positions.append((epoch, offset))
                yield self.to_torchrec(batch)
            epoch, offset = epoch + 1, 0

    def segment(self, limit: int) -> Iterator[Batch]:
        n = 0
        for batch in itertools.islice(self.batches, limit):
            n += 1
            yield batch
        self.ran_out = n < limit

    def after_step(self, pos: Position, loss: torch.Tensor, logits: torch.Tensor,
                   labels: torch.Tensor) -> None:  # fmt: skip
        pos.epoch, pos.offset = self.positions.popleft()
        self.loss_sum, self.loss_n = self.loss_sum + float(loss), self.loss_n + 1

    def report(self, step: int, lr: float) -> None:
        """The mean loss over the window and the ranks, with the progress line."""
        mean = all_mean(self.loss_sum / max(self.loss_n, 1), self.ctx.device)
        self.loss_sum, self.loss_n = 0.0, 0
        if self.progress:
            self.progress.train(step, mean, lr)

    def should_stop(self) -> str | None:
        # Said, not silent: a short run must not pass for a whole one.
        return f"the training data ran out ({self.planned} steps planned)" if self.ran_out else None

    def checkpoint_due(self, step: int) -> bool:
        return False

    def after_checkpoint(self, step: int) -> None:
        pass

    def meta(self) -> dict[str, Any]:
        return {"skipped_rows": self.train.skipped_rows}

    def write_files(self, step_dir: Path) -> None:
        pass

    def close(self) -> None:
        pass

    def ended(self, first_step: int, step: int) -> None:
        pass
