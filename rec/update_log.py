"""Reading the update log (rec.contract.updates) in Python, and the rules a replica applies it by.

`PartitionedLogReader` (rec.logs.update_reader) is the one Python reader of the log, in either
layout: a cursor per partition, XREAD, a reconnect from the same cursors when a node goes away,
each entry decoded. rec's Triton model (serve/python_backend/updates.py), the store's follower
(rec.store.follow) and `read_records` (how tests, benchmarks, the demo and a resuming publisher
look into a log) all read through it.

`Applier` is the one Python copy of the replica rules; rec-server's EmbeddingTables
(cpp/src/updates/embedding_tables.cpp) is the reference they follow, rule for rule:

    - a record of another run than the served version's is refused (an export with no run id
      takes the run of the first record it applies);
    - records of one rank are applied in log order; a record whose (gen, step) is older than the
      newest its rank has applied is refused (a watermark going backwards), the same one again
      is applied again (the publisher re-sends after a broker error: a row is its whole value);
    - a record for a table the served model lacks, of the wrong dtype or dim, or with ids outside
      the table, is refused whole and counted, never applied in part;
    - a record's id map changes (format version 2, a ZCH table's) are checked against the map the
      replica holds before anything is written: a slot outside the table's slots or the
      admitted id's window (slot_range), an admitted id another slot holds since the record's
      own (gen, step) or admitted twice (id_held), an eviction of an id the slot does not hold
      or an admission into a slot still held (map_mismatch) refuse the record whole. Ranks'
      records may arrive out of order: each slot keeps the (gen, step) of its last change, and
      rec.served_map's rule decides by those (an older holder of an admitted id is vacated, a
      slot's change older than its last one, or that one sent again, leaves the map). An
      accepted record's rows, evictions and admissions are written under the same lock;
    - a record that says which raw id each row's slot holds (format version 3, `held`) is
      refused as map_mismatch when that disagrees with the map after its changes, each slot as
      of the record's (gen, step) (a table kept by raw id in the store has no map: `held` is
      where its rows go);
    - rows of records at or before the export's (gen, step) are skipped: the export holds them;
    - the watermark is the smallest (gen, step) over the run's ranks of their newest complete
      publish (`last`), once every rank has completed one; the first record of a newer
      generation (a resume, maybe on another number of ranks) starts that count over, and a
      complete publish of an older generation no longer counts. The served watermark (`mark`)
      starts at the export's (gen, step) and only grows.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rec.contract.updates import FORMAT_V2, UpdateError, UpdateRecord
from rec.logs.update_reader import PartitionedLogReader
from rec.served_map import Plan, ServedMap


def read_records(url: str, start: str = "0", count: int = 1000) -> list[tuple[str, UpdateRecord]]:
    """Every record of the log at `url` as (entry id, record), raising an UpdateError for a
    malformed one: of the legacy stream after entry id `start`; of a partitioned log all of
    them, each partition's in its order, the partitions one after another a read at a time."""
    reader = PartitionedLogReader(url, start, count=count, block_ms=None, redis_retries=True)
    out: list[tuple[str, UpdateRecord]] = []
    try:
        while entries := reader.read():
            for entry_id, rec in entries:
                if isinstance(rec, UpdateError):
                    raise rec
                out.append((entry_id, rec))
        return out
    finally:
        reader.close()


@dataclass(frozen=True)
class ServedTable:
    rows: int
    dim: int
    dtype: str


class Applier:
    """The replica rules (module docstring) over the served model's `tables` and the embedding
    store's `stored` ones (rec.contract.store: their records are checked and count toward the
    watermark, their rows go where the subclass puts them), for an export of `export` (gen,
    step) of run `run`. `write(rec)` puts a checked record's rows where they are served; this
    class keeps them in `rows` (table -> row id -> bytes): what a replica would hold, for tests
    and tools. rec's Triton model (ServedTables) writes them into its buffers, the store's
    follower (rec.store.follow) into the store.

    `maps`: the ZCH tables' id maps (ServedMap), which a record's map changes are checked
    against and written into, with its rows.

    `lock` is held by apply() for a whole record; a reader that must not see a record half
    applied holds it too."""

    def __init__(self, tables: dict[str, ServedTable], export: tuple[int, int] = (0, 0),
                 run: str = "", stored: dict[str, ServedTable] | None = None,
                 maps: dict[str, ServedMap] | None = None) -> None:  # fmt: skip
        self.tables, self.stored, self.export, self.run = tables, stored or {}, export, run
        self.maps = maps or {}
        self.raw_keyed: set[str] = set()
        """Stored tables keyed by raw id (ZCH tables in the store): no map, their records place
        rows by `held` (format version 3), a subclass's write() says how."""
        self.lock = threading.Lock()
        self.rows: dict[str, dict[int, bytes]] = {}
        self.rank_version: dict[int, tuple[int, int]] = {}
        self.complete: dict[int, tuple[int, int, int]] = {}  # rank -> gen, step, wall_ns
        self.world = 0
        self.refused: Counter = Counter()
        self.applied_rows = 0
        self.mark = (*export, 0)
        """The served watermark (gen, step, wall_ns): from the export's, only growing."""
        self._complete_gen = 0
        self._plan: Plan | None = None  # how _check_map's record changes a map

    def write(self, rec: UpdateRecord) -> None:
        """Puts the rows of `rec` (checked, newer than the export) where they are served."""
        if not rec.count:
            return
        width = len(rec.rows) // rec.count
        table = self.rows.setdefault(rec.table, {})
        for i, row_id in enumerate(rec.ids):
            table[row_id] = rec.rows[i * width : (i + 1) * width]

    def apply(self, rec: UpdateRecord) -> tuple[str, str]:
        """Applies `rec` whole or refuses it whole: (outcome, why); outcome is "applied",
        "skipped" or a refusal (rec-server's rec_update_records_total outcomes), `why` says
        what is wrong with a refused one ("" otherwise)."""
        with self.lock:
            if self.run and rec.run != self.run:
                why = f"record of run {rec.run!r}, the served version is of run {self.run!r}"
                outcome = "other_run"
            else:
                why = self._check(rec)
                outcome = why.split(":")[0].replace(" ", "_") if why else "applied"
            if why is not None:
                self.refused[outcome] += 1
                return outcome, why
            changes = rec.count or rec.evicted or rec.admitted
            if changes and rec.version <= self.export:
                outcome = "skipped"
            elif changes:
                why = self._check_map(rec)
                if why is not None:
                    outcome = why.split(":")[0].replace(" ", "_")
                    self.refused[outcome] += 1
                    return outcome, why
                if rec.count or (rec.evicted and rec.table in self.raw_keyed):
                    self.write(rec)  # a raw-keyed table's evictions delete ids: write() too
                served = self.maps.get(rec.table)
                if (rec.evicted or rec.admitted) and served is not None:
                    served.write(rec, self._plan)
                self.applied_rows += rec.count
            self.run = self.run or rec.run
            self._advance(rec)
            return outcome, ""

    def _check(self, rec: UpdateRecord) -> str | None:
        seen = self.rank_version.get(rec.rank)
        if seen is not None and rec.version < seen:
            return f"backwards: rank {rec.rank} sent {rec.version} after {seen}"
        if rec.count == 0 and not (rec.evicted or rec.admitted):
            return None
        served = self.tables.get(rec.table) or self.stored.get(rec.table)
        if served is None:
            return f"unknown table: {rec.table!r} is not in the served model"
        if (rec.dtype, rec.dim) != (served.dtype, served.dim):
            return (f"row format: {rec.table!r} is served as {served.dtype} dim {served.dim}, "
                    f"the record has {rec.dtype} dim {rec.dim}")  # fmt: skip
        if rec.ids and rec.ids[-1] >= served.rows:
            return f"id range: id {rec.ids[-1]} is outside {rec.table!r}'s {served.rows} rows"
        return None

    def _check_map(self, rec: UpdateRecord) -> str | None:
        """Why the map changes of `rec` (checked, newer than the export) cannot apply, or why
        its `held` ids disagree with the map, or None (self._plan: how to write them); after
        the export's records are skipped, since the export's map already holds theirs. A
        table served without a map (a modulo one, or one the store keys by raw id) reads no
        `held`."""
        if rec.table in self.raw_keyed and rec.held is None:
            return (f"row format: {rec.table!r} is stored by raw id, and a record of format "
                    f"{FORMAT_V2!r} or older does not say which id a row is")  # fmt: skip
        served = self.maps.get(rec.table)
        self._plan = None
        if rec.evicted or rec.admitted:
            if served is None and rec.table not in self.raw_keyed:
                return (f"slot range: {rec.table!r} is not a ZCH table of the served model: "
                        "no slots")  # fmt: skip
            if served is not None:
                why, self._plan = served.check(rec.table, rec)
                if why is not None:
                    return why
        return served.check_held(rec.table, rec, self._plan) if served is not None else None

    def _advance(self, rec: UpdateRecord) -> None:
        self.rank_version[rec.rank] = rec.version
        if rec.gen > self._complete_gen:  # a resumed run: its ranks (maybe fewer) start over
            self._complete_gen = rec.gen
            self.complete.clear()
        self.world = rec.world
        if not rec.last or rec.gen < self._complete_gen:
            return
        self.complete[rec.rank] = (rec.gen, rec.step, rec.wall_ns)
        low = self.watermark()
        if low is not None and low[:2] > self.mark[:2]:
            self.mark = low
            for served in self.maps.values():
                served.settle(low[:2])

    def watermark(self) -> tuple[int, int, int] | None:
        """(gen, step, wall_ns) of the oldest complete publish of the newest generation, once
        every rank has one (of ranks at the same step, the earliest clock); else None."""
        if not self.world or len(self.complete) < self.world:
            return None
        return min(self.complete.values())

    def held_by(self) -> int | None:
        """The rank holding the watermark back, once some rank of the newest generation has a
        complete publish: a rank with none yet (the smallest), else the one whose newest is
        the oldest while another's is newer; None when no rank is behind another."""
        if not self.world or not self.complete:
            return None
        missing = [r for r in range(self.world) if r not in self.complete]
        if missing:
            return missing[0]
        versions = {r: v[:2] for r, v in self.complete.items()}
        low = min(versions, key=lambda r: (versions[r], r))
        return low if versions[low] < max(versions.values()) else None


class WatermarkWatch:
    """Names the partition holding a replica's watermark back (#60): rank r writes partition
    r mod P, so a silent rank (stopped, slow, or its partition's master away) is a silent
    partition. `check()` returns a line to log, or None: "held" once the holding rank
    (Applier.held_by) has not been heard from for max(5 s, 4 x publish.every_seconds), and
    "spoke again" when the watermark moves on after that. `heard(rec)` after each record read.
    `partitions()`: the log's P (0: one stream, the line names the rank only)."""

    def __init__(self, applier: Applier, partitions: Callable[[], int], every_seconds: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.applier, self.partitions, self.clock = applier, partitions, clock
        self.after_s = max(5.0, 4 * every_seconds)
        self.since = clock()
        self.last: dict[int, float] = {}  # rank -> when its last record was read
        self.held: tuple[int, tuple[int, ...]] | None = None  # (rank, mark) reported

    def heard(self, rec: UpdateRecord) -> None:
        self.last[rec.rank] = self.clock()

    def name(self, rank: int) -> str:
        p = self.partitions()
        return f"partition {rank % p} (rank {rank})" if p else f"rank {rank}"

    def held_partition(self) -> int:
        """rec_update_watermark_held_by, as rec-server's: the partition holding the watermark
        back (rank mod P; one stream: the rank), -1: none."""
        rank, p = self.applier.held_by(), self.partitions()
        return -1 if rank is None else rank % p if p else rank

    def silent_ms(self) -> dict[int, float]:
        """rec_update_partition_silent_ms, as rec-server's: per partition (one stream: 0), ms
        since a record of its ranks (r mod P) was read, or since the watch started."""
        now, p = self.clock(), max(self.partitions(), 1)
        heard = {k: self.since for k in range(p)}
        for rank, at in self.last.items():
            heard[rank % p] = max(heard[rank % p], at)
        return {k: (now - at) * 1000 for k, at in heard.items()}

    def check(self) -> str | None:
        rank, mark = self.applier.held_by(), self.applier.mark[:2]
        if self.held is not None:
            if (rank, mark) == self.held:
                return None
            was, self.held = self.held, None
            return (f"watermark moved on from gen {was[1][0]} step {was[1][1]}: "
                    f"{self.name(was[0])} spoke again")  # fmt: skip
        if rank is None:
            return None
        silent = self.clock() - self.last.get(rank, self.since)
        if silent < self.after_s:
            return None
        self.held = (rank, mark)
        return (f"watermark held at gen {mark[0]} step {mark[1]} by {self.name(rank)}: "
                f"silent {silent:.0f} s")  # fmt: skip


def write_rows(buffer, place: dict, ids, rows: bytes) -> None:
    """Writes log rows into a served model's storage buffer (a uint8 torch tensor) at rec.json's
    `place` for their table ("updates.tables.<name>"): the Python twin of rec-server's
    EmbeddingTables::Apply, for rec's Triton model and the tests."""
    import torch

    n = len(ids)
    if n == 0:
        return
    data = torch.frombuffer(bytearray(rows), dtype=torch.uint8).view(n, -1)
    if place["scale_bias"] == "first":  # FBGEMM keeps scale and bias before the codes
        data = torch.cat([data[:, -4:], data[:, :-4]], dim=1)
    width = data.shape[1]
    starts = place["offset"] + torch.tensor(ids, dtype=torch.int64) * place["row_stride"]
    index = (starts[:, None] + torch.arange(width)).flatten()
    buffer.index_put_((index,), data.flatten())
