"""Files made from the synthetic stream: try the file readers, or test them number for number.

Each writer stores positions [start, start + n) of a synthetic split so that reading the file
back gives exactly the synthetic batches:
  - Criteo TSV holds the raw integer counts (the reader applies the same log1p) and one hex id
    per categorical field, so it needs a one-hot config (data.synthetic.max_hotness: 1);
    a zero count is written as an empty field on even positions, to exercise both spellings;
  - CSV holds the dense values exactly (the decimal form of the f32 value) and multi-valued
    cells joined by data.columns.separator;
  - Parquet holds f32 dense values, one-hot features as nullable int64, multi-hot ones as
    list<int64>.

Example:
    >>> from rec.config import default_config
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "train.csv")
    >>> write_csv(default_config(), path, n=10)
    10
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator

import numpy as np

from rec.config import RecConfig
from rec.data.synthetic import Chunk, SyntheticSource

_PIECE = 65_536  # samples generated and written at a time, so any n fits in memory


def _pieces(cfg: RecConfig, split: str, n: int, start: int) -> Iterator[Chunk]:
    src = SyntheticSource(cfg, split)
    for lo in range(start, start + n, _PIECE):
        yield src.take(lo, min(lo + _PIECE, start + n))


def _bag_cells(chunk: Chunk, fmt: str, separator: str = "|") -> np.ndarray:
    """[n, F] object array: each bag's ids formatted with `fmt` and joined ("" if empty)."""
    rows = chunk.rows
    text = [format(v, fmt) for v in rows.values.tolist()]
    flat = rows.lengths.reshape(-1)
    if flat.max(initial=0) <= 1:  # one-hot: no joining needed
        cells = np.full(flat.shape, "", dtype=object)
        cells[flat == 1] = text
    else:
        ends = np.cumsum(flat).tolist()
        cells = np.array(
            [separator.join(text[e - k : e]) for e, k in zip(ends, flat.tolist(), strict=True)],
            dtype=object,
        )
    return cells.reshape(rows.lengths.shape)


def _label_cells(chunk: Chunk) -> np.ndarray:
    return np.where(chunk.rows.labels > 0, "1", "0").astype(object)


def write_criteo_tsv(
    cfg: RecConfig, path: str | os.PathLike, n: int, start: int = 0, split: str = "train"
) -> int:
    """Writes n synthetic samples as Criteo TSV lines (T labels, 13 counts, 26 hex ids).

    Returns n. Raises ValueError if a bag holds more than one id (Criteo fields are
    single-valued: use data.synthetic.max_hotness: 1).
    """
    from rec.data.criteo import check_criteo_shape

    check_criteo_shape(cfg)
    with open(path, "w", newline="") as f:
        for chunk in _pieces(cfg, split, n, start):
            if chunk.rows.lengths.max(initial=0) > 1:
                raise ValueError(
                    "Criteo TSV holds one id per categorical field; this config makes multi-hot "
                    "bags (set data.synthetic.max_hotness: 1)"
                )
            dense = chunk.counts.astype(str).astype(object)
            even = (chunk.rows.pos % 2 == 0)[:, None]
            dense[(chunk.counts == 0) & even] = ""  # Criteo's missing value, read as 0 too
            table = np.concatenate([_label_cells(chunk), dense, _bag_cells(chunk, "08x")], 1)
            f.writelines("\t".join(line) + "\n" for line in table.tolist())
    return n


def write_csv(
    cfg: RecConfig, path: str | os.PathLike, n: int, start: int = 0, split: str = "train"
) -> int:
    """Writes n synthetic samples as CSV with a header, columns as data.columns names them."""
    from rec.data.tabular import resolve_columns

    cols = resolve_columns(cfg)
    with open(path, "w", newline="") as f:
        out = csv.writer(f, delimiter=cfg.data.delimiter, lineterminator="\n")
        out.writerow(cols.all)
        for chunk in _pieces(cfg, split, n, start):
            # repr of the f32 value widened to f64 is exact, so reading it back is too.
            dense = chunk.rows.dense.astype(np.float64)
            dense_cells = np.array([repr(x) for x in dense.reshape(-1).tolist()], dtype=object)
            table = np.concatenate(
                [
                    _label_cells(chunk),
                    dense_cells.reshape(dense.shape),
                    _bag_cells(chunk, "d", cols.separator),
                ],
                axis=1,
            )
            out.writerows(table.tolist())
    return n


def write_parquet(
    cfg: RecConfig,
    path: str | os.PathLike,
    n: int,
    start: int = 0,
    split: str = "train",
    row_group_size: int = 4096,
) -> int:
    """Writes n synthetic samples as Parquet, in row groups of `row_group_size`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rec.data.tabular import resolve_columns

    cols = resolve_columns(cfg)
    src = SyntheticSource(cfg, split)
    multi = src.world.multi_hot
    schema = pa.schema(
        [(c, pa.float32()) for c in cols.labels + cols.dense]
        + [
            (c, pa.list_(pa.int64()) if m else pa.int64())
            for c, m in zip(cols.sparse, multi, strict=True)
        ]
    )
    with pq.ParquetWriter(str(path), schema) as writer:
        for chunk in _pieces(cfg, split, n, start):
            rows = chunk.rows
            arrays = [pa.array(rows.labels[:, t]) for t in range(rows.labels.shape[1])]
            arrays += [pa.array(rows.dense[:, j]) for j in range(rows.dense.shape[1])]
            ends = np.cumsum(rows.lengths, axis=None).reshape(rows.lengths.shape)
            for f in range(rows.lengths.shape[1]):
                lengths = rows.lengths[:, f]
                if multi[f]:  # list<int64> from (offsets, flat ids) without Python lists
                    start_f = ends[:, f] - lengths
                    take = np.repeat(start_f - (np.cumsum(lengths) - lengths), lengths)
                    ids = rows.values[take + np.arange(int(lengths.sum()))]
                    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                    arrays.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)))
                else:
                    ids = np.zeros(len(rows), dtype=np.int64)
                    ids[lengths == 1] = rows.values[(ends[:, f] - 1)[lengths == 1]]
                    arrays.append(pa.array(ids, mask=lengths == 0))
            table = pa.Table.from_arrays(arrays, schema=schema)
            writer.write_table(table, row_group_size=row_group_size)
    return n
