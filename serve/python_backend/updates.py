"""Fresh embeddings (docs/update_log.md, Contract 3): the update log applied to the loaded
model's tables while it serves, as rec-server applies it.

When the version's rec.json has an `updates` section, a daemon thread reads the update log
(rec.logs.update_reader.PartitionedLogReader, every partition from its start) and writes the
rows of the records after the export's (gen, step) into model.pt's TBE storage buffers in
place. The log's URL is rec.json's `updates.url`, or the config's `updates_url` (rec-server's
`--updates URL|none`: a URL overrides it, `none` turns the log off). The rules are
rec.update_log.Applier's, which are rec-server's (a record is applied whole or refused whole:
other run, unknown table, wrong dtype or dim, id out of range, backwards, malformed), the
writer is rec.update_log.write_rows. A ZCH table's id map changes (format version 2) are
checked by the same rules (slot_range, id_held, map_mismatch) and written into model.pt's map
buffers (rec.json "zch.tables.<t>.buffers") with the rows, under the same lock. Each model
instance (its own stub process) keeps its own copy of the tables and its own reader."""

from __future__ import annotations

import threading
import time
from collections import Counter

import torch

from rec.contract import ManifestError
from rec.contract.updates import UpdateError, parse_url, row_bytes
from rec.logs.update_reader import PartitionedLogReader
from rec.logs.update_trim import Registration, TrimWatch, reader_name
from rec.update_log import Applier, ServedMap, ServedTable, WatermarkWatch, write_rows

from .config import InstanceConfig, LoadError
from .metrics import UpdateMetrics

_BLOCK_MS = 300  # how long one XREAD waits for news; bounds how long close() waits
_BATCH_ENTRIES = 256


class ServedTables(Applier):
    """The loaded model's tables as the update log writes them: rec.update_log.Applier's rules,
    accepted rows written into the storage buffers (rec.update_log.write_rows). Rows of tables
    in the embedding store (`stored`, rec.json "store") are checked and count toward the
    watermark, but are not written here: the store's follower (rec.store.follow) writes them to
    the store, where every batch reads them; `refresh(record)` puts them in the row cache.

    `lock` (Applier's) is held by apply() for a whole record and by a forward pass for its whole
    run: a plain mutex, not rec-server's writer-preferring reader-writer lock, because the Python
    backend runs one execute() at a time per instance (each instance is its own stub process
    with its own tables), so there are never two readers to share it, and with one reader and
    one writer that each release it after one pass or one record neither can starve the other.
    """

    def __init__(self, updates, buffers, stored=None, refresh=None, zch=None, raw_keyed=()):
        places, stored = updates["tables"], stored or {}
        self.refresh = refresh
        super().__init__(
            tables={n: ServedTable(p["rows"], p["dim"], p["dtype"]) for n, p in places.items()},
            export=(int(updates.get("gen") or 0), int(updates.get("step") or 0)),
            run=updates.get("run") or "",
            stored={n: ServedTable(t["rows"], t["dim"], t["dtype"]) for n, t in stored.items()},
            maps={n: _served_map(n, t, buffers) for n, t in (zch or {}).items()},
        )
        self.places = places
        # Stored ZCH tables, refreshed by the raw ids they name; after the base's __init__,
        # which starts the set empty.
        self.raw_keyed = set(raw_keyed)
        self.buffers = {name: _buffer(name, place, buffers) for name, place in places.items()}

    def write(self, rec):
        if rec.table in self.buffers:
            write_rows(self.buffers[rec.table], self.places[rec.table], rec.ids, rec.rows)
        elif self.refresh is not None:
            self.refresh(rec)


def _buffer(name, place, buffers):
    """Table `name`'s storage buffer, checked to hold the rows rec.json places in it."""
    buffer = buffers.get(place["buffer"])
    if buffer is None:
        raise ValueError(f'rec.json: "updates.tables.{name}.buffer" names '
                         f"{place['buffer']!r}, which the model does not hold")  # fmt: skip
    size, stride = buffer.numel(), place["row_stride"]
    rowwise = place["dtype"] in ("int8", "int4")
    fits = (buffer.dtype == torch.uint8 and buffer.is_contiguous() and buffer.dim() == 1
            and stride >= row_bytes(place["dim"], place["dtype"]) and stride > 0
            and 0 <= place["offset"] <= size and place["rows"] >= 0
            and place["rows"] <= (size - place["offset"]) // stride
            and (place["scale_bias"] == "first") == rowwise)  # fmt: skip
    if not fits:
        raise ValueError(
            f'rec.json: "updates.tables.{name}" (offset {place["offset"]}, '
            f"{place['rows']} rows of {stride} bytes) does not fit its buffer of {size} bytes"
        )
    return buffer


def _served_map(name, table, buffers):
    """ZCH table `name`'s id map in model.pt (rec.json "zch.tables.<name>": its buffers, keys
    and used of every lookup reading it), which the update log's map changes write in place."""
    names = table["buffers"]
    copies = []
    for keys_name in (b for b in names if b.endswith(".keys")):
        used_name = keys_name[: -len(".keys")] + ".used"
        keys, used = buffers.get(keys_name), buffers.get(used_name)
        if keys is None or used is None or used_name not in names:
            raise ValueError(f'rec.json: "zch.tables.{name}.buffers" names {keys_name!r} and '
                             f"{used_name!r}, which the model does not hold")  # fmt: skip
        slots = table["slots"]
        shapes = (keys.dtype, used.dtype, keys.shape, used.shape)
        if shapes != (torch.int64, torch.bool, (slots,), (slots,)):
            raise ValueError(f"ZCH table {name!r}: the model's map is not int64 and bool "
                             f"[{slots}] (zch.tables.{name}.slots)")  # fmt: skip
        copies.append((keys, used))
    if not copies:
        raise ValueError(f'rec.json: "zch.tables.{name}.buffers" names no id map')
    return ServedMap(table["probes"], copies)


def open_updates(config: InstanceConfig, manifest, model, refresh, families, log):
    """(ServedTables, UpdateReader) of the version, as rec.json's "updates" and the config's
    `updates_url` say (empty: rec.json's url), or (None, None) when it takes no log. `refresh`
    (None without a store) puts a stored table's record in the row cache."""
    name = config.name
    try:
        updates = manifest.updates if manifest is not None else None
    except ManifestError as e:
        raise LoadError(f"model '{name}': {e}") from None
    url = config.updates_url or (updates.url if updates else None) or ""
    if not url or url == "none":
        return None, None  # no log: served as exported, with no lock taken
    try:
        parse_url(url)
    except UpdateError as e:
        raise LoadError(f"model '{name}': {e}") from None
    if not updates or config.model_path.endswith(".pt2"):
        log("warn", f"{config.where} cannot take updates (rec's Triton model applies the update "
                    'log to a TorchScript export with rec.json "updates" only); serving it as '
                    "exported")  # fmt: skip
        return None, None
    try:
        stored = manifest.store.to_dict()["tables"] if manifest.has("store") else None
        zch = manifest.zch.to_dict()["tables"] if manifest.has("zch") else None
        # A stored ZCH table (keyed by raw id) has no map in model.pt: its records go into
        # the store reader's cache by the raw ids they name (rec.updates/3's `held`).
        raw = {n for n, t in (stored or {}).items() if t.get("keys") == "raw_id"}
        zch = {n: t for n, t in zch.items() if n not in raw} if zch else zch
        tables = ServedTables(updates.to_dict(), dict(model.named_buffers()), stored, refresh,
                              zch, raw)  # fmt: skip
    except (KeyError, ValueError) as e:
        raise LoadError(f"model '{name}': {e}") from None
    metrics = UpdateMetrics(families, name, config.version)
    return tables, UpdateReader(name, url, tables, metrics, log)


class UpdateReader:
    """The daemon thread that reads the update log at `url` from its start (rec.logs.
    update_reader.PartitionedLogReader: XREAD BLOCK, up to _BATCH_ENTRIES entries a read per
    partition; a node that goes away or errors is retried from the same cursors, so nothing is
    lost or applied twice out of order) and applies each record to `tables`. Refusals are
    counted and the first few of each kind logged. A rank whose partition holds the watermark
    back is named once it has been silent a while, and again when it speaks
    (rec.update_log.WatermarkWatch)."""

    def __init__(self, model, url, tables, metrics, log):
        self.model, self.tables, self.metrics, self.log = model, tables, metrics, log
        self.log_reader = PartitionedLogReader(url, count=_BATCH_ENTRIES, block_ms=_BLOCK_MS,
                                               on_event=self._event)  # fmt: skip
        self.watch = WatermarkWatch(tables, lambda: self.log_reader.partitions)
        # What it still needs, for the log's trim: its cursors (a restart reads from the start,
        # and its export's mark covers what a trim removed before it).
        self.registration = Registration(url, reader_name(f"triton:{model}"),
                                         lambda: dict(self.log_reader.places()))  # fmt: skip
        self.trim = TrimWatch(url)
        self.trimmed_past = None
        self._trim_said = 0.0
        """Why its rows miss records a trim removed (logged as an error), or None."""
        self._stop = threading.Event()
        self._logged = Counter()
        self._thread = threading.Thread(target=self._loop, name="rec-updates", daemon=True)
        self._thread.start()

    def stop(self, timeout=5.0):
        self._stop.set()
        self.registration.stop()
        self._thread.join(timeout)

    def _say(self, level, message):
        self.log(level, f"model '{self.model}': {message}")

    def _event(self, kind, message):
        if kind != "error":
            self.metrics.set("connected", 1 if kind == "up" else 0)
        self._say("info" if kind == "up" else "warn", message)

    def _loop(self):
        self.trim.check(self.log_reader.places(), self.tables.mark[:2])  # before any read
        for entries in self.log_reader.follow(self._stop):
            for entry_id, record in entries:
                try:
                    self._take(entry_id, record)
                except Exception as e:  # the reader must outlive one bad entry
                    self._say("error", f"update log entry {entry_id}: {e!r}")
                if not isinstance(record, UpdateError):
                    self.watch.heard(record)
            if line := self.watch.check():
                self._say("warn", line)
            self.metrics.watch(self.watch.held_partition(), self.watch.silent_ms())
            self._check_trim()

    def _check_trim(self):
        """Past a trim of the log, it says so (error, at first and every 60 s) rather than serve
        rows that silently miss records."""
        line = self.trim.check(self.log_reader.places(), self.tables.mark[:2])
        now = time.monotonic()
        if line and (line != self.trimmed_past or now - self._trim_said > 60):
            self._say("error", line)
            self._trim_said = now
        self.trimmed_past = line

    def _take(self, entry_id, record):
        if isinstance(record, UpdateError):
            outcome, why = "malformed", str(record)
        else:
            outcome, why = self.tables.apply(record)
        self.metrics.count(outcome)
        if outcome == "applied":
            self.metrics.applied(record.count, self.tables.mark)
        elif outcome != "skipped":
            self._logged[outcome] += 1
            n = self._logged[outcome]
            if n <= 5 or n % 1000 == 0:  # a bad publisher must not flood the log
                self._say("warn", f"refused update log entry {entry_id} ({outcome}): {why}")
