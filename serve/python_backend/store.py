"""The rows of a tiered model's stored tables (docs/store.md, Contract 4), read from the
embedding store as rec-server reads them.

When the version's rec.json has a `store` section, its large tables are in a Redis Cluster
and model.pt's plain forward refuses to run. StoreRows opens a rec.store.reader.StoreReader on
the section (a store that cannot be reached, or that holds no finished export under the
version's prefix, is StoreUnavailable: rec.serve.triton retries such a load every 2 s) and
gives every batch its rows: store_ids, then the reader's row cache (the misses read with one
pipelined HMGET per partition), for forward_with_rows. A row the store does not have, or one
of the wrong size, is a StoreError naming the row; a store that does not answer is
StoreUnavailable naming the store. Never a zero row. The retries after a moved slot or a lost
node are redis-py's cluster client's own, not rec-server's 3 s.
"""

from __future__ import annotations

import threading

import numpy as np

from rec.contract.store import StoreError, check_section, meta_key


class StoreUnavailable(StoreError):
    """The store did not answer (a node down or unreachable, the cluster down, a timeout)."""


class StoreRows:
    """The stored tables of a tiered model (rec.export.tiered) behind a rec.json `store`
    section: rows(lengths, values) are the batch's rows, store_ids' keys read through a
    rec.store.reader.StoreReader, for forward_with_rows. Opening it checks that the store
    answers and holds a finished export under the section's prefix (its meta hash)."""

    def __init__(self, model, section, cache_bytes=0, raw_columns=()):
        from rec.store.reader import StoreReader  # loaded only for a version with a store

        check_section(section)
        self.model, self.url = model, section["url"]
        # Per request column: its stored table's index when keyed by raw id (ZCH), else -1;
        # the raw ids the store lacked are counted per column, per thread, as unknown ids.
        self.raw_columns = list(raw_columns)
        self.unknown = threading.local()
        try:
            self.reader = StoreReader(section, cache_bytes)
        except StoreError as e:  # "store URL: cannot reach the cluster (...)"
            why = str(e).removeprefix(f"store {self.url}: ")
            raise StoreUnavailable(f"embedding store {self.url} unreachable: {why}") from None
        try:
            finished = self.reader.client.exists(meta_key(section["prefix"]))
        except Exception as e:
            self.reader.close()
            raise self._unavailable(e) from None
        if not finished:
            self.reader.close()
            raise StoreUnavailable(f"embedding store {self.url}: no finished export under "
                                   f"'{section['prefix']}' (its meta hash is missing)")  # fmt: skip

    def rows(self, lengths, values):
        keys = self.model.store_ids(lengths, values)
        defaulted = [] if any(t >= 0 for t in self.raw_columns) else None
        try:
            rows = self.reader.rows(keys, defaulted)
        except StoreError as e:  # a row missing or of the wrong size: the reader names it
            raise StoreError(f"embedding {e}" if str(e).startswith("store ") else str(e)) from None
        except Exception as e:
            raise self._unavailable(e) from None
        if defaulted is not None:
            self.unknown.per_column = self._count(lengths, values, set(defaulted))
        return rows

    def _count(self, lengths, values, lacked):
        """Per request column, its ids whose (table, raw id) is in `lacked` (-1: not a stored
        ZCH table's column)."""
        cols = len(self.raw_columns)
        column = np.arange(lengths.numel()) % cols
        owner = np.repeat(column, lengths.reshape(-1).numpy())
        table = np.asarray(self.raw_columns)[owner]
        ids = values.numpy()
        out = [0 if t >= 0 else -1 for t in self.raw_columns]
        for k in np.flatnonzero(table >= 0).tolist():
            if (int(table[k]), int(ids[k])) in lacked:
                out[owner[k]] += 1
        return out

    def take_unknown(self):
        """The unknown ids per column counted on this thread since the last take (or [])."""
        out = getattr(self.unknown, "per_column", [])
        self.unknown.per_column = []
        return out

    def _unavailable(self, e):
        from redis.exceptions import RedisClusterException, RedisError

        if not isinstance(e, (RedisError, RedisClusterException, OSError)):
            return e  # not the store's: raised as it is
        return StoreUnavailable(f"embedding store {self.url} unavailable: {type(e).__name__}: {e}")

    def close(self):
        self.reader.close()


def raw_columns(manifest):
    """Per request column (manifest.sparse_names), the index (store order) of its stored table
    when that is keyed by raw id (a ZCH table, rec.store/2), else -1."""
    store = manifest.store
    order = sorted(store.tables)
    owner = {f: t["name"] for t in manifest.data.get("tables", []) for f in t.get("features", [])}
    return [order.index(owner[f]) if owner.get(f) in order and
            store.tables[owner[f]].keys == "raw_id" else -1
            for f in manifest.sparse_names]  # fmt: skip
