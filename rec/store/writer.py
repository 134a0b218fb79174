"""Export's sink into the store: a table's rows, quantized as the model stores them, into their
partition hashes (rec.contract.store), pipelined per node, with nothing written over an export
that is already there.

Example:
    >>> sink = StoreSink(url, prefix, {"t0": spec})  # doctest: +SKIP
    >>> stream_tables(reader, cfg, [sink], keys=keys); sink.finish(run, step)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from rec.contract.store import (
    DEFAULT_FIELD,
    MARKER_FIELD,
    StoreError,
    is_raw_keyed,
    meta_key,
    partition_key,
    section_format,
)
from rec.quantize import fused_rows
from rec.store.client import connect

# Fields per HSET: large enough that a round trip carries ~1 MB, small enough not to stall a node.
BATCH_FIELDS = 8192


class StoreSink:
    """Writes the rows of `tables` (name -> {dim, dtype, partitions, ...}, rec.json's per-table
    store entry) under `prefix`; other tables' rows are ignored. Refuses a prefix already used.

    A table keyed by raw id (rec.store/2, a ZCH table) is written by its map (`maps[table]`,
    rec.export.id_maps.TableMap): an admitted slot's row under its raw id, the default row (the
    last) once, in partition 0, and every partition's marker field; free slots not at all."""

    def __init__(self, url: str, prefix: str, tables: dict[str, dict],
                 maps: dict | None = None) -> None:  # fmt: skip
        self.url, self.prefix, self.tables = url, prefix, tables
        self.maps = {t: maps[t] for t in tables if is_raw_keyed(tables[t])} if maps else {}
        missing = [t for t in tables if is_raw_keyed(tables[t]) and t not in self.maps]
        if missing:
            raise StoreError(f"store: tables {missing} are keyed by raw id but no id map was given")
        self.client = connect(url)
        if self.client.exists(meta_key(prefix)) or any(
            self.client.exists(partition_key(prefix, t, 0)) for t in tables
        ):
            raise StoreError(f"store {url}: keys under {prefix!r} exist already: an earlier "
                             "export of this model version and run, maybe by another repository "
                             "whose servers read them. Export another version (--version N), or "
                             "delete them with `rec store delete REPO --version N` once nothing "
                             "serves them")  # fmt: skip
        self.rows_written = 0
        self.marked: set[str] = set()  # raw-keyed tables whose partitions' markers are written
        self.seconds = 0.0

    def write(self, table: str, start: int, rows: torch.Tensor) -> None:
        spec = self.tables.get(table)
        if spec is None:
            return
        t0 = time.perf_counter()
        data = fused_rows(rows, spec["dtype"]).numpy()
        ids = np.arange(start, start + data.shape[0])
        if table in self.maps:
            data, ids = self._by_raw_id(table, start, data, ids)
        parts = spec["partitions"]
        pipe = self.client.pipeline(transaction=False)
        pending = 0
        for p in range(parts):
            # Row (raw id) r is in partition r % parts (non-negative): the rows of this chunk
            # that are, in order.
            mine = np.flatnonzero(ids % parts == p)
            if mine.size == 0:
                continue
            key = partition_key(self.prefix, table, p)
            for s in range(0, mine.size, BATCH_FIELDS):
                fields = {str(ids[k]): data[k].tobytes() for k in mine[s : s + BATCH_FIELDS]}
                pipe.hset(key, mapping=fields)
                pending += len(fields)
                if pending >= 4 * BATCH_FIELDS:
                    pipe.execute()
                    pipe, pending = self.client.pipeline(transaction=False), 0
        if pending:
            pipe.execute()
        self.rows_written += data.shape[0]
        self.seconds += time.perf_counter() - t0

    def _by_raw_id(self, table: str, start: int, data: np.ndarray,
                   slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """A raw-keyed table's chunk of rows (slots start..): the admitted slots' rows and raw
        ids; the default row (slot `slots`) written apart, once; the markers with the first."""
        spec, m = self.tables[table], self.maps[table]
        if table not in self.marked:
            self.marked.add(table)
            pipe = self.client.pipeline(transaction=False)
            for p in range(spec["partitions"]):
                pipe.hset(partition_key(self.prefix, table, p), MARKER_FIELD, b"")
            pipe.execute()
        default = np.flatnonzero(slots == spec["slots"])
        if default.size:
            key = partition_key(self.prefix, table, 0)
            self.client.hset(key, DEFAULT_FIELD, data[default[0]].tobytes())
        inside = slots < spec["slots"]
        held = np.zeros(slots.shape, dtype=bool)
        held[inside] = m.used.numpy()[slots[inside]]
        return data[held], m.keys.numpy()[slots[held]]

    def finish(self, run: str, step: int) -> None:
        """Mark the export whole: the meta hash, written last."""
        self.client.hset(meta_key(self.prefix), mapping={
            "format": section_format(self.tables), "run": run, "step": str(step),
            "tables": json.dumps(self.tables, sort_keys=True)})  # fmt: skip

    def close(self) -> None:
        self.client.close()


def delete_prefix(url: str, prefix: str, tables: dict[str, dict]) -> int:
    """Delete an export's keys (its partitions, then its meta); the number of keys deleted."""
    client = connect(url)
    try:
        n = 0
        for table, spec in tables.items():
            for p in range(spec["partitions"]):
                n += client.delete(partition_key(prefix, table, p))
        return n + client.delete(meta_key(prefix))
    finally:
        client.close()
