"""Fresh rows into the embedding store: the update log's rows of a version's stored tables,
written into that version's partition hashes (rec.contract.store) as training publishes them.

One follower per stored version. It reads the log (rec.contract.updates) from where it last
stopped, through rec.logs.update_reader.PartitionedLogReader (a node that goes away is retried
from the same entries), applies each record by the servers' rules (rec.update_log.Applier: same
run, in order, checked, rows newer than the export only) and writes the accepted rows with one
pipelined HSET per partition (a ZCH table's by raw id, from rec.updates/3's `held`, its evicted
ids deleted). The store keeps the follower's place in the version's meta hash (`follow_id`, or
`follow_id:<k>` for each partition k of a partitioned log, and the watermark it reached as
`follow_gen`, `follow_step`), so a restarted follower goes on from there and never re-applies
an older record over a newer one.

Replicas read the same log: rec-server writes a stored table's rows into its own row cache as
it applies each record, so a replica serves a row fresh from its cache even before the follower
has written it here, and a row it has not cached comes from here (docs/store.md).

Example:
    >>> follower = StoreFollower(read_manifest(path), "redis://127.0.0.1:6379")  # doctest: +SKIP
    >>> follower.run(stop)  # until `stop` is set  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rec.contract.manifest import Manifest
from rec.contract.sections import StoreSection, UpdatesSection
from rec.contract.store import (
    DEFAULT_FIELD,
    StoreError,
    meta_key,
    partition_key,
    raw_id_partition,
)
from rec.contract.updates import UpdateError, UpdateRecord, parse_url
from rec.logs.update_reader import Entry, PartitionedLogReader
from rec.logs.update_trim import Registration, TrimWatch, reader_name
from rec.served_map import Version
from rec.update_log import Applier, ServedTable, WatermarkWatch

READ_ENTRIES = 256
"""Log entries one XREAD returns at most (a record is up to 16,384 rows)."""
FLUSH_ROWS = 32768
"""Rows a pipeline holds before it is sent: 256 full records would be half a GB of Kaggle rows."""


@dataclass
class FollowStats:
    records: int = 0
    rows: int = 0
    refused: int = 0
    seconds_writing: float = 0.0


class IdPlaces:
    """rec.served_map's order rule for a table the store keys by raw id, per id rather than per
    slot: the ids a record moved (admitted, or found in another slot than last seen) or evicted,
    with the slot each holds (None: evicted) and since which (gen, step). An id evicted by one
    rank and admitted by another may reach the log in either order, and a lagging rank's rows of
    the id's old slot after its new slot's: the newer (gen, step) decides, not the arrival.

    An entry is dropped once the follower's watermark reaches its (gen, step): every rank has
    sent all it published up to there, so no older record of that id can still come."""

    def __init__(self) -> None:
        self.at: dict[int, tuple[int | None, Version]] = {}

    def evicts(self, slot: int, raw: int, version: Version) -> bool:
        """Whether an eviction of `raw` from `slot` deletes its row: not when the id took
        another slot at this (gen, step) or later."""
        now = self.at.get(raw)
        if now is not None and now[0] != slot and now[1] >= version:
            return False
        self.at[raw] = (None, version)
        return True

    def places(self, slot: int, raw: int, version: Version, admitted: bool) -> bool:
        """Whether `slot`'s row at `version` is `raw`'s row now: not when the id has been in
        another slot (or evicted) since a later (gen, step)."""
        now = self.at.get(raw)
        if now is not None and now[0] != slot and now[1] > version:
            return False
        if admitted or (now is not None and now[0] != slot):
            self.at[raw] = (slot, version)
        return True

    def settle(self, mark: Version) -> None:
        self.at = {raw: at for raw, at in self.at.items() if at[1] > mark}


class StoreApplier(Applier):
    """Applier whose rows go into the stored tables' partition hashes under `prefix`.

    A ZCH table the store keys by raw id (rec.store/2) takes only records that say which id
    each row's slot holds (rec.updates/3's `held`): a record's evicted ids are deleted, then each
    held row is written under its raw id and the default row (the table's last) as the table's
    default; a row of a free slot is not written (no id reads it). Evictions go first, so an id
    a record both evicts and places (another slot) keeps its row. Across ranks the records'
    (gen, step) decide (IdPlaces): a late eviction or row of an id's old slot changes nothing.
    `dry`: the rules and IdPlaces only, nothing written (a restarted follower's replay).

    The tables the version keeps in its model (rec.json "updates.tables") are checked as a
    replica checks them and count toward the watermark, but nothing of them is written here
    (their id map changes, a ZCH table's, included): the replicas hold them."""

    def __init__(self, store: StoreSection, updates: UpdatesSection, client) -> None:
        tables = store.tables
        in_model = {n: ServedTable(p["rows"], p["dim"], p["dtype"])
                    for n, p in updates.tables.items() if n not in tables}  # fmt: skip
        super().__init__(
            tables=in_model,
            export=(updates.gen, updates.step),
            run=updates.run or "",
            stored={n: ServedTable(t.rows, t.dim, t.dtype) for n, t in tables.items()},
        )
        self.raw_keyed = {n for n, t in tables.items() if t.keys != "row"}
        self.prefix, self.partitions, self.client = store.prefix, tables, client
        self.pipe = client.pipeline(transaction=False)
        self.pending = 0
        self.places = {n: IdPlaces() for n in self.raw_keyed}
        self.dry = False

    def apply(self, rec: UpdateRecord) -> tuple[str, str]:
        mark = self.mark
        out = super().apply(rec)
        if self.mark != mark:
            for places in self.places.values():
                places.settle(self.mark[:2])
        return out

    def _check_map(self, rec: UpdateRecord) -> str | None:
        return None if rec.table in self.tables else super()._check_map(rec)

    def write(self, rec: UpdateRecord) -> None:
        if rec.table in self.tables:
            return  # kept in the model: the replicas write it
        parts = self.partitions[rec.table].partitions
        width = len(rec.rows) // rec.count if rec.count else 0
        row_of = {slot: rec.rows[i * width : (i + 1) * width] for i, slot in enumerate(rec.ids)}
        groups: dict[int, dict[str, bytes]] = {}
        if rec.table in self.raw_keyed:
            places, v = self.places[rec.table], rec.version
            gone: dict[int, list[str]] = {}
            for slot, raw_id in rec.evicted:
                if places.evicts(slot, raw_id, v):
                    gone.setdefault(raw_id_partition(raw_id, parts), []).append(str(raw_id))
            if self.dry:
                gone = {}
            for p, fields in gone.items():  # before the rows: see the class docstring
                self.pipe.hdel(partition_key(self.prefix, rec.table, p), *fields)
            admitted = set(rec.admitted)
            for slot, raw_id in rec.held or ():
                if places.places(slot, raw_id, v, (slot, raw_id) in admitted):
                    groups.setdefault(raw_id_partition(raw_id, parts), {})[str(raw_id)] = row_of[
                        slot
                    ]
            default = self.partitions[rec.table].rows - 1
            if default in row_of:
                groups.setdefault(0, {})[DEFAULT_FIELD] = row_of[default]
        else:
            for slot, row in row_of.items():
                groups.setdefault(slot % parts, {})[str(slot)] = row
        if self.dry:
            return
        for p, fields in groups.items():
            self.pipe.hset(partition_key(self.prefix, rec.table, p), mapping=fields)
        self.pending += rec.count + len(rec.evicted)
        if self.pending >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.pipe.execute()
            self.pipe, self.pending = self.client.pipeline(transaction=False), 0


class StoreFollower:
    """Follows the update log at `updates_url` (default: rec.json's `updates.url`) into the
    store of the version whose rec.json is `manifest` (its `store` and `updates` sections)."""

    def __init__(self, manifest: Manifest, updates_url: str | None = None,
                 log: Callable[[str], None] = print) -> None:  # fmt: skip
        from rec.store.client import connect

        store, updates = manifest.store, manifest.updates
        if store is None:
            raise StoreError('rec.json has no "store" section: this version keeps every table in '
                             "its model file; there is nothing to follow into a store")  # fmt: skip
        if updates is None:
            raise StoreError('rec.json has no "updates" section (an export older than the update '
                             "log): its rows cannot be matched to the log's records")  # fmt: skip
        url = updates_url or updates.url
        if not url:
            raise StoreError("no update log to follow: the run did not publish (publish.url) and "
                             "no --updates URL was given")  # fmt: skip
        self.where = parse_url(url)
        self.url, self.store_url, self.log = url, store.url, log
        self.client = connect(store.url)
        self.meta = meta_key(store.prefix)
        if not self.client.exists(self.meta):
            raise StoreError(f"store {store.url}: no finished export under "
                             f"{store.prefix!r} (its meta hash is missing)")  # fmt: skip
        self.applier = StoreApplier(store, updates, self.client)
        saved = {k.decode(): v.decode() for k, v in self.client.hgetall(self.meta).items()
                 if k.startswith(b"follow_")}  # fmt: skip
        self.cursor = saved.get("follow_id", "0")
        self.cursors = {int(k.split(":")[1]): v for k, v in saved.items()
                        if k.startswith("follow_id:")}  # fmt: skip
        if saved.get("follow_run") and not self.applier.run:
            self.applier.run = saved["follow_run"]
        self.stats = FollowStats()
        moved = self.cursor != "0" or any(c != "0" for c in self.cursors.values())
        if self.applier.raw_keyed and moved:
            self._replay()

    def _replay(self) -> None:
        """A restarted follower of a table kept by raw id: the log up to its saved entry through
        the rules again, writing nothing, so that its order state (IdPlaces) is what it was
        when it stopped, and a lagging rank's eviction still keeps a moved id's row."""
        until = self.cursors or {0: self.cursor}
        reader = PartitionedLogReader(self.url, count=READ_ENTRIES, block_ms=None,
                                      redis_retries=True, until=until)  # fmt: skip
        self.applier.dry = True
        try:
            while entries := reader.read():
                for _, rec in entries:
                    if not isinstance(rec, UpdateError):
                        self.applier.apply(rec)
        finally:
            self.applier.dry = False
            reader.close()

    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> FollowStats:
        """Reads and applies until `stop` is set (or the log has been idle for `idle_exit_s`);
        logs progress every 10 s. A broker error is retried from the same entry."""
        log = PartitionedLogReader(self.url, self.cursor, cursors=self.cursors, count=READ_ENTRIES,
                                   block_ms=200, retry_s=0.1, max_retry_s=5.0,
                                   on_event=lambda _kind, line: self.log(line))  # fmt: skip
        watch = WatermarkWatch(self.applier, lambda: log.partitions)
        registration = Registration(self.url, reader_name("store-follow"),
                                    lambda: self._need(log))  # fmt: skip
        trim = TrimWatch(self.url)
        try:
            self._follow(log, stop, idle_exit_s, watch, trim)
        finally:
            registration.stop()
            log.close()
        self._progress()
        return self.stats

    def _need(self, log: PartitionedLogReader) -> dict[int, str]:
        """What the log's trim must keep for it: the cursors saved in the store (a restart
        resumes there, the reader's own may be ahead), or every partition from its start when
        a restart replays the log up to them (a table kept by raw id)."""
        start = {k: "0-0" for k in log.places()}
        if self.applier.raw_keyed:
            return start
        return {**start, **(self.cursors or {0: self.cursor})}

    def _follow(self, log: PartitionedLogReader, stop: threading.Event, idle_exit_s: float | None,
                watch: WatermarkWatch, trim: TrimWatch) -> None:  # fmt: skip
        """run()'s loop; past a trim of the log it stops with the trim and the recovery named
        (StoreError) rather than store rows that silently miss records."""
        last_entry, last_line = time.monotonic(), time.monotonic()
        trim.check(log.places(), self.applier.mark[:2])  # where it starts, before any read
        for entries in log.follow(stop):
            if line := trim.check(log.places(), self.applier.mark[:2]):
                raise StoreError(f"store follow stopped: {line}")
            if entries:
                self._apply(entries, log)
                last_entry = time.monotonic()
                for _, rec in entries:
                    if not isinstance(rec, UpdateError):
                        watch.heard(rec)
            if line := watch.check():
                self.log(f"store follow: {line}")
            elif idle_exit_s is not None and time.monotonic() - last_entry > idle_exit_s:
                break
            if time.monotonic() - last_line > 10:
                self._progress()
                last_line = time.monotonic()

    def _apply(self, entries: list[Entry], reader: PartitionedLogReader) -> None:
        t0 = time.perf_counter()
        for entry_id, rec in entries:
            if isinstance(rec, UpdateError):
                self.stats.refused += 1
                why = str(rec)
            else:
                outcome, why = self.applier.apply(rec)
                self.stats.refused += outcome not in ("applied", "skipped")
                self.stats.records += 1
                stored = outcome == "applied" and rec.table not in self.applier.tables
                self.stats.rows += rec.count if stored else 0
            if why and self.stats.refused <= 5:
                self.log(f"entry {entry_id} refused: {why}")
        # The rows, then where they came from: a follower killed in between re-applies these
        # entries (each row its whole value), it never skips one.
        self.applier.flush()
        if reader.layout is None:
            self.cursor = reader.cursor
            places = {"follow_id": self.cursor}
        else:
            self.cursors = reader.places()
            places = {f"follow_id:{k}": c for k, c in self.cursors.items()}
        gen, step, _ = self.applier.mark
        self.client.hset(self.meta, mapping={**places, "follow_gen": str(gen),
                                             "follow_step": str(step),
                                             "follow_run": self.applier.run})  # fmt: skip
        self.stats.seconds_writing += time.perf_counter() - t0

    def _progress(self) -> None:
        s = self.stats
        rate = s.rows / s.seconds_writing if s.seconds_writing else 0.0
        gen, step, _ = self.applier.mark
        self.log(f"store follow: {s.records} records, {s.rows} rows into {self.store_url} "
                 f"({rate:,.0f} rows/s writing), watermark gen {gen} step {step}, "
                 f"{s.refused} refused, at {self._place()}")  # fmt: skip

    def _place(self) -> str:
        if not self.cursors:
            return f"entry {self.cursor}"
        return ", ".join(f"partition {k} entry {c}" for k, c in sorted(self.cursors.items()))

    def close(self) -> None:
        self.client.close()
