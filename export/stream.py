"""Tables out of the checkpoint one row chunk at a time, into whatever stores them.

Export never holds a float table whole: `stream_tables` reads rows [r, r + chunk) of one table
from the checkpoint (export.dcp_reader), hands that fp32 block to every sink (the TBE of the
TorchScript model, the buffers of the ONNX model, the rows verification needs), and drops it.
Rowwise quantization is per row, so a table quantized chunk by chunk is byte for byte the table
quantized whole.

Example:
    >>> keys = table_keys(model)  # doctest: +SKIP
    >>> stream_tables(reader, cfg, [sink], chunk_rows=65536, keys=keys)  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from rec.config import RecConfig
from rec.export.dcp_reader import CheckpointReader

CHECKPOINT_PREFIX = "model.model."
"""The trainer saves {"model": TrainModel.state_dict()} and TrainModel holds the model as
`model`, so a model's state-dict key (rec.model.table_keys) is this plus it in the checkpoint."""
# Rows per chunk when export.chunk_rows is 0: 32 MiB of fp32, small against any table worth
# streaming and large enough that the per-chunk overhead does not show.
CHUNK_BYTES = 32 << 20

Log = Callable[[str], None]


class TableSink(Protocol):
    """Receives every row of every table exactly once, in row chunks."""

    def write(self, table: str, start: int, rows: torch.Tensor) -> None:
        """`rows` [n, dim] fp32 are rows [start, start + n) of `table`; not kept by the caller."""


def chunk_rows_for(dim: int, configured: int) -> int:
    """Rows per streamed chunk: `configured`, or CHUNK_BYTES worth of fp32 rows when it is 0."""
    return configured if configured > 0 else max(1, CHUNK_BYTES // (4 * dim))


def checkpoint_key(model_key: str) -> str:
    """The checkpoint's key of the model's state-dict key `model_key`."""
    return CHECKPOINT_PREFIX + model_key


def stream_tables(
    reader: CheckpointReader,
    cfg: RecConfig,
    sinks: Sequence[TableSink],
    chunk_rows: int = 0,
    log: Log | None = None,
    every_s: float = 10.0,
    *,
    keys: dict[str, str],
) -> None:
    """Every table of `cfg`, chunk by chunk, into every sink; progress lines every `every_s`.
    `keys`: table -> its weight's key in the model (rec.model.table_keys)."""
    total = sum(t.rows * t.dim * 4 for t in cfg.tables)
    done, t0, last = 0, time.perf_counter(), time.perf_counter()
    for table in cfg.tables:
        step = chunk_rows_for(table.dim, chunk_rows)
        key = checkpoint_key(keys[table.name])
        for start in range(0, table.rows, step):
            rows = reader.read_rows(key, start, min(table.rows, start + step))
            for sink in sinks:
                sink.write(table.name, start, rows)
            done += rows.numel() * 4
            del rows
            now = time.perf_counter()
            if log is not None and now - last >= every_s:
                last = now
                rate = done / (now - t0)
                eta = (total - done) / rate if rate > 0 else float("inf")
                share = 100 * done / total
                log(
                    f"tables: {done / 1e9:.2f} / {total / 1e9:.2f} GB fp32 ({share:.0f} %, "
                    f"{rate / 1e6:.0f} MB/s, ETA {eta:.0f} s)"
                )
    if log is not None:
        elapsed = time.perf_counter() - t0
        log(f"tables: {total / 1e9:.2f} GB fp32 streamed from the checkpoint in {elapsed:.1f} s")
