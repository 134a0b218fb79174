"""File sources: which files and rows form a split, and the rank-partitioned read loop.

Rows of the split's files, in file order, are numbered 0, 1, ... (global row index). With
`data.eval_paths` each split is all rows of its own files; without, rows whose global index
is a multiple of `eval_every_nth_row` form the eval split and the others the train split.
Split positions number a split's rows in order; `batches` semantics follow (rec.data.source).

Dense values are parsed raw and then transformed by the feature spec (rec.features), the same
code the exported model runs on a request's raw values; `raw_dense=True` skips that step, for
export's verification, which feeds the served model raw values as a client would.

A rank scans every block of rows it needs (counting lines is cheap) but parses only the rows
it owns. A bad row skipped (on_bad_row: skip) leaves a hole: the batch it belonged to is one
sample shorter, so the ranks never need each other's parses to agree on positions.
"""

from __future__ import annotations

import abc
import glob
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from rec.batch import RecBatch
from rec.config import RecConfig
from rec.data.errors import DataError
from rec.data.source import DataSource, Plan, Rows, assemble, empty_rows
from rec.features import feature_spec, transform_dense

_COUNTS: dict[tuple[str, int, int], int] = {}  # (path, size, mtime_ns) -> rows


def resolve_paths(patterns: list[str]) -> list[str]:
    """Files named by `patterns`, in order; each glob pattern's matches sorted."""
    paths: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
            if not matches:
                raise DataError(f"{pattern}: no file matches this pattern")
            paths += matches
        elif not os.path.isfile(pattern):
            raise DataError(f"{pattern}: file not found")
        else:
            paths.append(pattern)
    return paths


class FileSource(DataSource):
    """Base of the file readers. Subclasses say how to count, read and parse their files."""

    unit = "line"
    """How a bad-row message counts: 'line' (text files, header included) or 'row'."""

    def __init__(self, cfg: RecConfig, split: str, raw_dense: bool = False) -> None:
        if split not in ("train", "eval"):
            raise ValueError(f"split={split!r} must be 'train' or 'eval'")
        data = cfg.data
        self.split = split
        self.spec = feature_spec(cfg)
        self.raw_dense = raw_dense
        self.on_bad_row = data.on_bad_row
        self.num_dense = cfg.features.dense
        self.num_sparse = len(cfg.features.sparse)
        self.num_tasks = cfg.model.num_tasks
        if data.eval_paths:
            self.every = 0  # the split is every row of its own files
            patterns = data.train_paths if split == "train" else data.eval_paths
        else:
            self.every = data.eval_every_nth_row
            patterns = data.train_paths
        self.paths = resolve_paths(patterns)
        for path in self.paths:
            self._check_file(path)  # fail now on an unknown column, not mid-training
        self.skipped_rows = 0
        self._num: int | None = None

    # ---- what a subclass provides --------------------------------------------------------
    @abc.abstractmethod
    def _check_file(self, path: str) -> None:
        """Raises DataError if the file cannot hold the configured columns."""

    @abc.abstractmethod
    def _count_rows(self, path: str, limit: int = 0) -> int:
        """Data rows in the file (header excluded); with a `limit`, reading may stop once
        that many are counted."""

    @abc.abstractmethod
    def _blocks(self, path: str, skip: int) -> Iterator[tuple[int, Any, int]]:
        """(first row index in the file, block, rows in block), from a row <= `skip` on."""

    @abc.abstractmethod
    def _parse(self, path: str, block: Any, idx: np.ndarray, row0: int) -> tuple[Rows, dict]:
        """Parses rows `idx` of a block starting at file row `row0`.

        Returns the good rows (pos unset) and {index into idx: message} for the bad ones.
        """

    # ---- rows and positions --------------------------------------------------------------
    def count_rows(self, path: str) -> int:
        """Rows of one file, counted once per (path, size, mtime)."""
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
        if key not in _COUNTS:
            _COUNTS[key] = self._count_rows(path)
        return _COUNTS[key]

    def num_samples(self) -> int:
        if self._num is None:
            self._num = self._split_before(sum(self.count_rows(p) for p in self.paths))
        return self._num

    def samples_at_least(self, n: int) -> int:
        """The split's samples, or any number >= `n` of them: files are read only as far as
        `n` samples take (a Parquet file counts from its footer), so the launcher can check
        the data before any rank starts without reading it all."""
        enough = (n + 1) * max(self.every, 1)  # global rows that hold n of either split's
        g = 0
        for path in self.paths:
            g += self._count_rows(path, limit=enough - g)
            if g >= enough:
                break
        return self._split_before(g)

    def _split_before(self, g: int) -> int:
        """How many of the global rows [0, g) belong to this split."""
        if not self.every:
            return g
        held_out = (g + self.every - 1) // self.every
        return held_out if self.split == "eval" else g - held_out

    def _global_row(self, pos: int) -> int:
        """The global row of split position `pos`."""
        n = self.every
        if not n:
            return pos
        if self.split == "eval":
            return pos * n
        return (pos // (n - 1)) * n + pos % (n - 1) + 1 if n > 1 else 0

    def _positions(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(in-split mask, split positions) of global rows g [m]."""
        n = self.every
        if not n:
            return np.ones(g.shape, dtype=bool), g
        held_out = g % n == 0
        if self.split == "eval":
            return held_out, g // n
        return ~held_out, g - g // n - 1

    def reject(self, bad: dict[int, str]) -> None:
        """Raises for the first bad row, or counts them all as skipped (on_bad_row: skip)."""
        if not bad:
            return
        if self.on_bad_row == "error":
            raise DataError(bad[min(bad)])
        self.skipped_rows += len(bad)

    # ---- the read loop -------------------------------------------------------------------
    def _batches(self, plan: Plan) -> Iterator[RecBatch]:
        empty = empty_rows(self.num_dense, self.num_sparse, self.num_tasks)
        return assemble(self._pieces(plan), plan, empty)

    def _pieces(self, plan: Plan) -> Iterator[tuple[Rows | None, int]]:
        """(owned rows, positions scanned so far), block by block, file by file."""
        first = plan.start + plan.rank * plan.batch_size  # first position this rank owns
        if first >= plan.end:
            return
        first_row = self._global_row(first)
        g0 = 0  # global index of the current file's first row
        for path in self.paths:
            n = self.count_rows(path)
            if g0 + n <= first_row:  # the whole file comes before this rank's first row
                g0 += n
                continue
            for row0, block, m in self._blocks(path, max(first_row - g0, 0)):
                in_split, pos = self._positions(np.arange(g0 + row0, g0 + row0 + m))
                idx = np.flatnonzero(in_split & plan.owns(pos))
                rows = None
                if idx.size:
                    rows, bad = self._parse(path, block, idx, row0)
                    self.reject(bad)
                    if not self.raw_dense:
                        rows.dense = transform_dense(self.spec, rows.dense)
                    good = np.ones(idx.size, dtype=bool)
                    good[list(bad)] = False
                    rows.pos = pos[idx[good]]
                scanned = self._split_before(g0 + row0 + m)
                yield rows, scanned
                if scanned >= plan.end:
                    return
            g0 += n


def build_rows(
    labels: np.ndarray, dense: np.ndarray, lengths: np.ndarray, values: np.ndarray, good
) -> Rows:
    """Rows from parsed columns of n rows, keeping those where `good` [n] is true.

    Args:
        labels: [n, T] floats. dense: [n, D] floats. lengths: [n, F] ids per bag.
        values: [sum(lengths)] int64 ids, batch-major. good: [n] bool.
    """
    rows = Rows.build(
        dense.astype(np.float32),
        lengths.astype(np.int32),
        values.astype(np.int64),
        labels.astype(np.float32),
        np.zeros(len(lengths), dtype=np.int64),
    )
    return rows.select(good)
