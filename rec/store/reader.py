"""Rows out of the store for the keys a tiered model asks for (rec.export.tiered): the Python
reader that export's verification, rec's Triton model and the tests use. rec-server has its own
in C++ (cpp/src/store). It imports no export code and no FBGEMM (tests/store/test_reader.py),
so rec's Triton model loads neither; export's scorer over it is rec.export.tiered.TieredScorer.

Per batch: the rows the RowCache holds (if the reader has one), the rest grouped by partition,
one HMGET per partition, pipelined (redis-py sends each node its share), the rows put back in
key order. A row the store does not have is an error that names it, never a zero row; except
in a table keyed by raw id (rec.store/2, a ZCH table), where an id the store lacks reads the
table's default row, read once, when first needed. A missing partition is an error there
too: each HMGET also asks for the partition's marker field.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rec.contract.store import (
    DEFAULT_FIELD,
    MARKER_FIELD,
    TABLE_SHIFT,
    StoreError,
    is_raw_keyed,
    partition_key,
    raw_id_partition,
    store_order,
)
from rec.store.client import connect
from rec.store.plan import ENTRY_OVERHEAD

ROW_MASK = (1 << TABLE_SHIFT) - 1

MIN_ROW_BYTES = 16
"""The sketch has a counter per row the cache could hold at this row size (as rec-server's)."""
_SEEDS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5)
_U64 = (1 << 64) - 1
_HALVED = bytes(c >> 1 for c in range(256))
_DEFAULT = b""
"""A raw-keyed cache's entry for an id the update log evicted: read the table's default row."""


class FrequencySketch:
    """TinyLFU's count-min sketch, as rec-server's (cpp/src/store/row_cache.h): 4 rows of
    counters that stop at 15, every count halved after `entries` additions (not Caffeine's
    10 x: see row_cache.h)."""

    def __init__(self, entries: int) -> None:
        width = 16
        while width < max(entries, 1):
            width <<= 1
        self.mask = width - 1
        self.rows = [bytearray(width) for _ in _SEEDS]
        self.added, self.sample = 0, max(entries, 1)

    @property
    def bytes(self) -> int:
        return len(self.rows) * (self.mask + 1)

    def _slots(self, key: int) -> list[int]:
        return [((((key & _U64) * s) & _U64) >> 29) & self.mask for s in _SEEDS]

    def count(self, key: int) -> int:
        return min(row[i] for row, i in zip(self.rows, self._slots(key), strict=True))

    def add(self, key: int) -> None:
        for row, i in zip(self.rows, self._slots(key), strict=True):
            if row[i] < 15:
                row[i] += 1
        self.added += 1
        if self.added >= self.sample:
            self.rows = [bytearray(row.translate(_HALVED)) for row in self.rows]
            self.added = 0


class RowCache:
    """Rows by key, bounded in bytes (row + ENTRY_OVERHEAD each, and the sketch), evicted by
    CLOCK with TinyLFU's admission as rec-server's cache is (docs/store.md says why). Not
    thread-safe: its reader's lock guards it."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.sketch = FrequencySketch(capacity_bytes // (ENTRY_OVERHEAD + MIN_ROW_BYTES))
        self.bytes = self.sketch.bytes
        self.rows: dict[int, bytes] = {}
        self.used: dict[int, bool] = {}
        self.ring: deque[int] = deque()

    def get(self, key: int) -> bytes | None:
        self.sketch.add(key)
        row = self.rows.get(key)
        if row is not None:
            self.used[key] = True
        return row

    def put(self, key: int, row: bytes, always: bool = False) -> None:
        """Keeps `row` for `key`. A new row that needs room is kept only if asked for more
        often than the row it would evict, unless `always` (the update log's rows)."""
        cost = len(row) + ENTRY_OVERHEAD
        if cost > self.capacity - self.sketch.bytes:
            return
        old = self.rows.get(key)
        if old is not None:  # a newer copy: same place on the ring
            self.bytes += len(row) - len(old)
        else:
            if not always and self.bytes + cost > self.capacity:
                victim = self._victim()
                if victim is not None and self.sketch.count(key) <= self.sketch.count(victim):
                    return
            self.ring.append(key)
            self.used[key] = False
            self.bytes += cost
        self.rows[key] = row
        while self.bytes > self.capacity and self.ring:
            victim = self.ring.popleft()
            if self.used[victim]:
                self.used[victim] = False
                self.ring.append(victim)
                continue
            self.bytes -= len(self.rows.pop(victim)) + ENTRY_OVERHEAD
            del self.used[victim]

    def _victim(self) -> int | None:
        """The row the hand evicts next, second chances given on the way."""
        while self.ring and self.used[self.ring[0]]:
            key = self.ring.popleft()
            self.used[key] = False
            self.ring.append(key)
        return self.ring[0] if self.ring else None


@dataclass
class ReaderStats:
    """rec-server's rec_store_* counters, for rec's Triton model's metrics."""

    cache_hits: int = 0
    cache_misses: int = 0
    lookups: int = 0
    lookup_ns: int = 0
    failed_lookups: int = 0
    refreshed_rows: int = 0


class StoreReader:
    """Reads the rows of a rec.json `store` section, through a RowCache of `cache_bytes` (0:
    none). Thread-safe.

    A table keyed by raw id has a cache of its own, keyed by raw id (a raw id and a table index
    do not fit in one int64 key): `cache_bytes` is split evenly over the caches, the row-keyed
    tables' one (if any) and one per raw-keyed table, as rec-server splits it."""

    def __init__(self, section: dict[str, Any], cache_bytes: int = 0) -> None:
        self.url, self.prefix = section["url"], section["prefix"]
        self.names = store_order(section)
        self.tables = [section["tables"][n] for n in self.names]
        self.raw = [is_raw_keyed(t) for t in self.tables]
        self.client = connect(self.url)
        caches = sum(self.raw) + (not all(self.raw))
        each = cache_bytes // caches
        self.cache = RowCache(each) if cache_bytes > 0 else None
        self.raw_caches = {t: RowCache(each) for t, raw in enumerate(self.raw)
                           if raw and cache_bytes > 0}  # fmt: skip
        self.defaults: dict[int, bytes] = {}  # read when first needed (_default_row)
        self.stats = ReaderStats()
        self.lock = threading.Lock()

    def _default_row(self, t: int) -> bytes:
        """Raw-keyed table t's default row (partition 0's DEFAULT_FIELD), checked; read once."""
        if t in self.defaults:
            return self.defaults[t]
        key = partition_key(self.prefix, self.names[t], 0)
        row = self.client.hget(key, DEFAULT_FIELD)
        want = self.tables[t]["row_bytes"]
        if row is None or len(row) != want:
            got = "missing" if row is None else f"{len(row)} bytes, want {want}"
            raise StoreError(f"store {self.url}: the default row of table {self.names[t]!r} "
                             f"(field {DEFAULT_FIELD!r} of {key!r}) is {got}")  # fmt: skip
        self.defaults[t] = row
        return row

    def _cache_of(self, t: int, field: int) -> tuple[RowCache | None, int]:
        """(the cache holding table t's row `field`, its key there)."""
        if self.raw[t]:
            return self.raw_caches.get(t), field
        return self.cache, t << TABLE_SHIFT | field

    def refresh(self, table: str, ids, rows: bytes) -> None:
        """Fresh rows of stored table `table` (the update log's, in `ids` order) into the cache,
        present or not, as rec-server's EmbeddingStore::Refresh does."""
        t = self.names.index(table)
        if self.raw[t]:
            # Slots, not raw ids: refresh_raw places a record of it by its `held` ids.
            raise StoreError(f"store: table {table!r} is keyed by raw id; the update log's rows "
                             "of it go in by raw id (refresh_raw), not by slot")  # fmt: skip
        if self.cache is None:
            return
        width = self.tables[t]["row_bytes"]
        with self.lock:
            for i, row in enumerate(ids):
                key = t << TABLE_SHIFT | int(row)
                self.cache.put(key, rows[i * width : (i + 1) * width], always=True)
            self.stats.refreshed_rows += len(ids)

    def refresh_raw(self, table: str, rec) -> None:
        """A record (rec.contract.updates, format version 3) of stored ZCH table `table` into
        the cache by raw id: its evicted ids become entries that read the default row (so a
        miss cannot read an evicted id's old row back from the store before `rec store follow`
        deletes it), then each held row goes under its id, always kept, and the default row
        (the table's last) becomes the one unknown ids read."""
        t = self.names.index(table)
        width, default = self.tables[t]["row_bytes"], self.tables[t]["rows"] - 1
        row_of = {slot: rec.rows[i * width : (i + 1) * width] for i, slot in enumerate(rec.ids)}
        cache = self.raw_caches.get(t)
        with self.lock:
            if default in row_of:
                self.defaults[t] = row_of[default]
            if cache is not None:
                for _, raw_id in rec.evicted:
                    cache.put(raw_id, _DEFAULT, always=True)
                for slot, raw_id in rec.held or ():
                    cache.put(raw_id, row_of[slot], always=True)
            self.stats.refreshed_rows += len(rec.ids)

    def rows(self, keys: torch.Tensor, defaulted: list | None = None) -> torch.Tensor:
        """uint8 [sum of row_bytes]: the rows of `keys` (table << 40 | row, or rec.store/2's
        (table, id) pairs [U, 2]), in that order. `defaulted` (if given) gets each (table, raw
        id) that read its table's default row (a raw id the store lacks)."""
        if keys.dim() == 2:
            tables, fields = keys[:, 0].tolist(), keys[:, 1].tolist()
        else:
            keys_np = keys.numpy()
            tables, fields = (keys_np >> TABLE_SHIFT).tolist(), (keys_np & ROW_MASK).tolist()
        pairs = list(zip(tables, fields, strict=True))
        found: list[bytes | None] = [None] * len(pairs)
        with self.lock:
            for k, (t, f) in enumerate(pairs):
                cache, key = self._cache_of(t, f)
                if cache is not None:
                    found[k] = cache.get(key)
                if found[k] == _DEFAULT:  # an id the update log evicted: the default row
                    found[k] = self._default_row(t)
                    if defaulted is not None:
                        defaulted.append(pairs[k])
            missing = [k for k, row in enumerate(found) if row is None]
            self.stats.cache_hits += len(found) - len(missing)
            self.stats.cache_misses += len(missing)
            if missing:
                t0 = time.perf_counter_ns()
                try:
                    fetched = self._fetch([pairs[k] for k in missing])
                except Exception:
                    self.stats.failed_lookups += 1
                    raise
                finally:
                    self.stats.lookups += 1
                    self.stats.lookup_ns += time.perf_counter_ns() - t0
                for k, row in zip(missing, fetched, strict=True):
                    if row is None:  # a raw id the store lacks: the default row, not cached
                        found[k] = self._default_row(pairs[k][0])
                        if defaulted is not None:
                            defaulted.append(pairs[k])
                        continue
                    found[k] = row
                    cache, key = self._cache_of(*pairs[k])
                    if cache is not None:
                        cache.put(key, row)
        return torch.from_numpy(np.frombuffer(b"".join(found), dtype=np.uint8).copy())

    def _fetch(self, pairs: list[tuple[int, int]]) -> list[bytes | None]:
        """The rows of (table, field) `pairs` from the store, in that order; None for a raw id
        the store lacks."""
        groups: dict[tuple[int, int], list[int]] = {}
        for k, (t, f) in enumerate(pairs):
            parts = self.tables[t]["partitions"]
            p = raw_id_partition(f, parts) if self.raw[t] else f % parts
            groups.setdefault((t, p), []).append(k)
        pipe = self.client.pipeline(transaction=False)
        order = list(groups)
        for t, p in order:
            fields = [str(pairs[k][1]) for k in groups[(t, p)]]
            # A raw-keyed partition's marker tells a missing hash from missing ids.
            pipe.hmget(partition_key(self.prefix, self.names[t], p),
                       fields + [MARKER_FIELD] if self.raw[t] else fields)  # fmt: skip
        found = pipe.execute()
        out: list[bytes | None] = [None] * len(pairs)
        for (t, p), values in zip(order, found, strict=True):
            want = self.tables[t]["row_bytes"]
            key = partition_key(self.prefix, self.names[t], p)
            if self.raw[t]:
                if values[-1] is None:
                    raise StoreError(f"store {self.url}: partition hash {key!r} of table "
                                     f"{self.names[t]!r} does not exist")  # fmt: skip
                values = values[:-1]
            for k, value in zip(groups[(t, p)], values, strict=True):
                what = "raw id" if self.raw[t] else "row"
                where = f"store {self.url}: {what} {pairs[k][1]} of table {self.names[t]!r}"
                if value is None:
                    if self.raw[t]:
                        continue
                    # A whole partition gone is told apart from one row gone (error path only).
                    why = (f"not in partition hash {key!r}" if self.client.exists(key)
                           else f"partition hash {key!r} does not exist")  # fmt: skip
                    raise StoreError(f"{where} is missing: {why}")
                if len(value) != want:
                    raise StoreError(f"{where} in partition hash {key!r} has {len(value)} bytes, "
                                     f"want {want}")  # fmt: skip
                out[k] = value
        return out

    def close(self) -> None:
        self.client.close()
