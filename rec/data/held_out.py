"""Events a stream run holds out of training, so that `rec export` verifies the model on events
it never trained on (issue #59).

About one event in `data.stream.hold_out_every_nth` is held out, chosen by a hash of its name
(entry id, place in the entry: rec.data.stream_reader.held_out_mask), so the same events on
every rank, resume and world size. A held-out event is consumed as a trained one is: the
position passes it and the lineage's event count and digest include it, so exactly once covers
both. It then goes to this rank's `HeldOut`, which keeps the newest `hold_out_keep / world`
events (the most recent ones are what a deployed model meets next).

At each checkpoint every rank writes the held-out events its position covers to
`held_out/rank<r>.npz` in the step directory (events read ahead of the position are left out:
a resume reads them again). Each event is named by (entry ms, entry seq, place, partition): the
partition of a partitioned stream (rec.contract.partitions), 0 for one stream; files of before
partitions have 3 columns and load as partition 0. A resume at any world size loads every
rank's file and keeps its share (of a partitioned stream: its own partitions' events);
`rec export` of a stream run's checkpoint scores its quality checks on all of them.
Dense values are kept raw (a client's values: the exported model applies the transforms).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np

from rec.batch import RecBatch
from rec.data.source import Rows
from rec.data.stream_reader import StreamPosition, entry_key

DIR = "held_out"


class HeldOut:
    """One rank's held-out events, the newest `keep` of them, with their names (rec.data.
    stream_reader.HoldOutSink)."""

    def __init__(self, every_nth: int, keep: int) -> None:
        self.every_nth, self.keep = every_nth, keep
        # rows, names [n, 4] (ms, seq, place, partition), whether a checkpoint already held them
        self.parts: deque[tuple[Rows, np.ndarray, bool]] = deque()
        self.size = 0

    def add(self, entry: str, rows: Rows, partition: int = 0) -> None:
        if len(rows) == 0 or self.keep <= 0:
            return
        ms, seq = entry_key(entry)
        n = len(rows)
        names = np.stack([np.full(n, ms), np.full(n, seq), rows.pos, np.full(n, partition)],
                         axis=1)  # fmt: skip
        self._append(rows, names.astype(np.int64), False)

    def _append(self, rows: Rows, names: np.ndarray, saved: bool) -> None:
        self.parts.append((rows, names, saved))
        self.size += len(rows)
        while self.parts and self.size - len(self.parts[0][0]) >= self.keep:
            self.size -= len(self.parts.popleft()[0])

    def covered(self, at: StreamPosition | dict[int, StreamPosition] | None,
                ) -> tuple[Rows, np.ndarray] | None:  # fmt: skip
        """The events up to position `at` (what a checkpoint at `at` has consumed: one
        stream's position, or each partition's; None: only those a checkpoint already held),
        the newest `keep` of them; None if there are none."""
        if not self.parts:
            return None
        rows = Rows.concat([r for r, _, _ in self.parts])
        names = np.concatenate([n for _, n, _ in self.parts])
        keep = np.concatenate([np.full(len(r), saved) for r, _, saved in self.parts])
        positions = at if isinstance(at, dict) else {} if at is None else {0: at}
        for k, pos in positions.items():
            ms, seq = entry_key(pos.entry)
            before = (names[:, 0] < ms) | ((names[:, 0] == ms) & (names[:, 1] < seq))
            inside = (names[:, 0] == ms) & (names[:, 1] == seq) & (names[:, 2] < pos.events)
            keep |= (before | inside) & (names[:, 3] == k)
        keep &= np.cumsum(keep[::-1])[::-1] <= self.keep  # the newest `keep`
        if not keep.any():
            return None
        return rows.select(keep), names[keep]

    def save(self, step_dir: Path, rank: int,
             at: StreamPosition | dict[int, StreamPosition] | None) -> None:  # fmt: skip
        """This rank's file in a checkpoint at position `at` (before it commits)."""
        got = self.covered(at)
        if got is None:
            return
        rows, names = got
        folder = Path(step_dir) / DIR
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / f"rank{rank}.npz", dense=rows.dense, lengths=rows.lengths,
                 values=rows.values, labels=rows.labels, names=names)  # fmt: skip

    def restore(self, step_dir: Path, rank: int, world: int, partitioned: bool = False) -> None:
        """A resume: this rank's share of the checkpoint's held-out events (every rank's files,
        whatever the world size that wrote them): of a partitioned stream, those of the
        partitions it reads (k mod world == rank), so each is saved again by its reader."""
        got = load(step_dir)
        if got is None:
            return
        rows, names = got
        share = names[:, 3] if partitioned else np.arange(len(rows))
        mine = share % world == rank
        self._append(rows.select(mine), names[mine], True)


def load(step_dir: Path) -> tuple[Rows, np.ndarray] | None:
    """Every rank's held-out events in a checkpoint, in the stream's order; None if none."""
    files = sorted((Path(step_dir) / DIR).glob("rank*.npz"))
    if not files:
        return None
    parts, names = [], []
    for path in files:
        with np.load(path) as f:
            parts.append(Rows.build(f["dense"], f["lengths"], f["values"], f["labels"],
                                    f["names"][:, 2]))  # fmt: skip
            got = f["names"]
        if got.shape[1] == 3:  # a file of before partitions: one stream, partition 0
            got = np.concatenate([got, np.zeros((len(got), 1), got.dtype)], axis=1)
        names.append(got)
    rows, all_names = Rows.concat(parts), np.concatenate(names)
    order = np.lexsort((all_names[:, 2], all_names[:, 3], all_names[:, 1], all_names[:, 0]))
    return _reorder(rows, order), all_names[order]


def _reorder(rows: Rows, order: np.ndarray) -> Rows:
    starts, ends = rows.offsets[:-1][order], rows.offsets[1:][order]
    values = np.concatenate([rows.values[a:b] for a, b in zip(starts, ends, strict=True)]) \
        if len(order) else rows.values  # fmt: skip
    return Rows.build(rows.dense[order], rows.lengths[order], values, rows.labels[order],
                      rows.pos[order])  # fmt: skip


def batches(step_dir: Path, batch_size: int) -> list[RecBatch]:
    """A checkpoint's held-out events as batches of raw dense values (rec export's quality
    checks); empty if it holds none."""
    got = load(step_dir)
    if got is None:
        return []
    rows = got[0]
    return [rows.take(i, min(i + batch_size, len(rows))).to_batch()
            for i in range(0, len(rows), batch_size)]  # fmt: skip
