"""Rows out of the store for the keys a tiered model asks for (rec.export.tiered): the Python
reader that export's verification, rec's Triton model and the tests use. rec-server has its own
in C++ (cpp/src/store) with a cache in front.

Per batch: the keys grouped by partition, one HMGET per partition, pipelined (redis-py sends
each node its share), the rows put back in key order. A row the store does not have is an
error that names it, never a zero row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rec.contract.store import StoreError, partition_key, store_order
from rec.export.tiered import TABLE_SHIFT
from rec.store.writer import connect

ROW_MASK = (1 << TABLE_SHIFT) - 1


class StoreReader:
    """Reads the rows of a rec.json `store` section."""

    def __init__(self, section: dict[str, Any]) -> None:
        self.url, self.prefix = section["url"], section["prefix"]
        self.names = store_order(section)
        self.tables = [section["tables"][n] for n in self.names]
        self.client = connect(self.url)

    def rows(self, keys: torch.Tensor) -> torch.Tensor:
        """uint8 [sum of row_bytes]: the rows of `keys` (table << 40 | row), in that order."""
        keys_np = keys.numpy()
        tables, rows = keys_np >> TABLE_SHIFT, keys_np & ROW_MASK
        groups: dict[tuple[int, int], list[int]] = {}
        for k, (t, r) in enumerate(zip(tables.tolist(), rows.tolist(), strict=True)):
            groups.setdefault((t, r % self.tables[t]["partitions"]), []).append(k)
        pipe = self.client.pipeline(transaction=False)
        order = list(groups)
        for t, p in order:
            fields = [str(int(rows[k])) for k in groups[(t, p)]]
            pipe.hmget(partition_key(self.prefix, self.names[t], p), fields)
        found = pipe.execute()
        out: list[bytes] = [b""] * len(keys_np)
        for (t, p), values in zip(order, found, strict=True):
            want = self.tables[t]["row_bytes"]
            for k, value in zip(groups[(t, p)], values, strict=True):
                where = f"store {self.url}: row {int(rows[k])} of table {self.names[t]!r}"
                if value is None:
                    raise StoreError(f"{where} is missing under {self.prefix!r}")
                if len(value) != want:
                    raise StoreError(f"{where} has {len(value)} bytes, want {want}")
                out[k] = value
        return torch.from_numpy(np.frombuffer(b"".join(out), dtype=np.uint8).copy())

    def close(self) -> None:
        self.client.close()


class TieredScorer:
    """A tiered model as a plain scorer (dense, lengths, values) -> scores: its store_ids, the
    rows read from the store, forward_with_rows."""

    def __init__(self, model: Any, reader: StoreReader) -> None:
        self.model, self.reader = model, reader

    def __call__(self, dense, lengths, values) -> torch.Tensor:
        rows = self.reader.rows(self.model.store_ids(lengths, values))
        return self.model.forward_with_rows(dense, lengths, values, rows)
