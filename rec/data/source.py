"""What every data source shares: rows in numpy form, the rank plan, and the `batches` loop.

Positions: the samples of one split form one pass, numbered 0..num_samples-1. Iteration k
gives rank r of W the positions [start + k*W*B + r*B, start + k*W*B + (r+1)*B). Because a
sample depends on its position only, concatenating the W ranks' batches of one window gives
exactly the single-rank batch of W*B samples at that position, whatever W is.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from rec.batch import RecBatch


@dataclass
class Rows:
    """n samples in the RecBatch layout, as numpy arrays, with their split positions.

    dense [n, D] f32, lengths [n, F] i32, values [N] i64 (batch-major), offsets [n + 1] i64
    (sample i's ids are values[offsets[i]:offsets[i + 1]]), labels [n, T] f32, pos [n] i64.
    """

    dense: np.ndarray
    lengths: np.ndarray
    values: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray
    pos: np.ndarray

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    @staticmethod
    def build(
        dense: np.ndarray, lengths: np.ndarray, values: np.ndarray, labels: np.ndarray, pos
    ) -> Rows:
        """Rows from arrays; computes the per-sample offsets into `values`."""
        offsets = np.zeros(len(dense) + 1, dtype=np.int64)
        np.cumsum(lengths.sum(axis=1, dtype=np.int64), out=offsets[1:])
        return Rows(dense, lengths, values, offsets, labels, np.asarray(pos, dtype=np.int64))

    def take(self, i: int, j: int) -> Rows:
        """Samples [i, j) (views, no copy)."""
        a, b = self.offsets[i], self.offsets[j]
        return Rows(
            self.dense[i:j],
            self.lengths[i:j],
            self.values[a:b],
            self.offsets[i : j + 1] - a,
            self.labels[i:j],
            self.pos[i:j],
        )

    def select(self, keep: np.ndarray) -> Rows:
        """The samples where the boolean mask `keep` [n] is true."""
        if keep.all():
            return self
        sample_of_value = np.repeat(np.arange(len(self)), np.diff(self.offsets))
        return Rows.build(
            self.dense[keep],
            self.lengths[keep],
            self.values[keep[sample_of_value]],
            self.labels[keep],
            self.pos[keep],
        )

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        if len(parts) == 1:
            return parts[0]
        return Rows.build(
            np.concatenate([p.dense for p in parts]),
            np.concatenate([p.lengths for p in parts]),
            np.concatenate([p.values for p in parts]),
            np.concatenate([p.labels for p in parts]),
            np.concatenate([p.pos for p in parts]),
        )

    def to_batch(self) -> RecBatch:
        """A RecBatch owning fresh memory (callers may modify it without touching caches)."""
        return RecBatch(
            dense=torch.from_numpy(np.array(self.dense, dtype=np.float32)),
            lengths=torch.from_numpy(np.array(self.lengths, dtype=np.int32)),
            values=torch.from_numpy(np.array(self.values, dtype=np.int64)),
            labels=torch.from_numpy(np.array(self.labels, dtype=np.float32)),
        )


@dataclass(frozen=True)
class Plan:
    """Which positions of a split one rank reads, and how they group into batches."""

    num_samples: int
    batch_size: int
    rank: int
    world_size: int
    start: int
    drop_last: bool

    @property
    def window(self) -> int:
        return self.batch_size * self.world_size

    @property
    def end(self) -> int:
        """One past the last position any rank reads."""
        if self.start >= self.num_samples:
            return self.start
        if not self.drop_last:
            return self.num_samples
        return self.start + (self.num_samples - self.start) // self.window * self.window

    def ranges(self) -> Iterator[tuple[int, int]]:
        """This rank's batches as position ranges [lo, hi); the last may be short (no drop_last)."""
        lo = self.start + self.rank * self.batch_size
        while lo < self.end:
            yield lo, min(lo + self.batch_size, self.end)
            lo += self.window

    def owns(self, pos: np.ndarray) -> np.ndarray:
        """Mask [n]: which of the positions `pos` [n] this rank reads."""
        q = pos - self.start
        return (q >= 0) & (pos < self.end) & ((q % self.window) // self.batch_size == self.rank)


def rank_plan(
    num_samples: int, batch_size: int, rank: int, world_size: int, start: int, drop_last: bool
) -> Plan:
    """Validates the arguments of `DataSource.batches` into a Plan."""
    for name, value in (("batch_size", batch_size), ("world_size", world_size)):
        if not (isinstance(value, int) and value > 0):
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"rank={rank!r} must be in [0, world_size={world_size})")
    if not (isinstance(start, int) and not isinstance(start, bool) and start >= 0):
        raise ValueError(f"start={start!r} must be a non-negative sample position")
    return Plan(num_samples, batch_size, rank, world_size, start, drop_last)


class DataSource(abc.ABC):
    """One split of one data set, read in rank-partitioned batches (see the module docstring)."""

    skipped_rows: int = 0
    """Bad rows this process dropped so far (data.on_bad_row: skip)."""

    @abc.abstractmethod
    def num_samples(self) -> int:
        """Samples in one pass over the split (bad rows that will be skipped included)."""

    def num_steps(self, batch_size: int, world_size: int, start: int = 0) -> int:
        """Full global windows (training steps with drop_last) from `start` to the end."""
        return max(self.num_samples() - start, 0) // (batch_size * world_size)

    def batches(
        self,
        batch_size: int,
        rank: int,
        world_size: int,
        start: int = 0,
        drop_last: bool = True,
    ) -> Iterator[RecBatch]:
        """Rank `rank`'s batches of `batch_size` samples, from position `start` to the end.

        With drop_last (training) only complete global windows of world_size * batch_size
        samples are read, so every rank takes the same number of steps; without it (eval)
        the tail is split the same way and a rank may get a short batch or none. A batch
        from which bad rows were skipped is shorter; with drop_last it is still yielded
        (even empty) so that the ranks stay in step.
        """
        plan = rank_plan(self.num_samples(), batch_size, rank, world_size, start, drop_last)
        return self._batches(plan)

    @abc.abstractmethod
    def _batches(self, plan: Plan) -> Iterator[RecBatch]: ...


def assemble(
    pieces: Iterable[tuple[Rows | None, int]], plan: Plan, empty: Rows
) -> Iterator[RecBatch]:
    """Cuts a stream of owned rows into the plan's batches.

    Args:
        pieces: (rows, scanned_to) in position order: `rows` holds only positions the plan
            owns (or is None), and every position < scanned_to has been seen.
        plan: the rank's plan; batch k is the k-th of `plan.ranges()`.
        empty: zero rows of the right widths, for a batch whose rows were all skipped.
    """
    ranges = plan.ranges()
    cur = next(ranges, None)
    held: list[Rows] = []
    for rows, scanned_to in pieces:
        if rows is not None and len(rows):
            held.append(rows)
        while cur is not None and scanned_to >= cur[1]:
            batch, held = _cut(held, cur[1], empty)
            if len(batch) or plan.drop_last:
                yield batch.to_batch()
            cur = next(ranges, None)
        if cur is None:
            return
    # The files ended early (they shrank since they were counted): hand out what was read.
    while cur is not None and held:
        batch, held = _cut(held, cur[1], empty)
        yield batch.to_batch()
        cur = next(ranges, None)


def _cut(held: list[Rows], hi: int, empty: Rows) -> tuple[Rows, list[Rows]]:
    """Splits held rows into (positions < hi, the rest)."""
    if not held:
        return empty, []
    rows = Rows.concat(held)
    cut = int(np.searchsorted(rows.pos, hi))
    rest = [rows.take(cut, len(rows))] if cut < len(rows) else []
    return rows.take(0, cut), rest


def empty_rows(num_dense: int, num_sparse: int, num_tasks: int) -> Rows:
    """Zero samples with the given widths."""
    return Rows.build(
        np.zeros((0, num_dense), np.float32),
        np.zeros((0, num_sparse), np.int32),
        np.zeros(0, np.int64),
        np.zeros((0, num_tasks), np.float32),
        np.zeros(0, np.int64),
    )
