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


def _bags(chunk: Chunk) -> list[list[np.ndarray]]:
    """Per sample, per feature: the bag's ids."""
    rows = chunk.rows
    cuts = np.cumsum(rows.lengths.reshape(-1))[:-1]
    bags = np.split(rows.values, cuts)
    num_f = rows.lengths.shape[1]
    return [bags[i * num_f : (i + 1) * num_f] for i in range(len(rows))]


def _label_text(labels: np.ndarray) -> list[str]:
    return ["1" if x else "0" for x in labels]


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
            for i, bags in enumerate(_bags(chunk)):
                even = chunk.rows.pos[i] % 2 == 0
                dense = ["" if c == 0 and even else str(c) for c in chunk.counts[i].tolist()]
                cats = [f"{int(b[0]):08x}" if b.size else "" for b in bags]
                f.write("\t".join(_label_text(chunk.rows.labels[i]) + dense + cats) + "\n")
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
            for i, bags in enumerate(_bags(chunk)):
                # repr of the f32 value widened to f64 is exact, so reading it back is too.
                dense = [repr(float(x)) for x in chunk.rows.dense[i]]
                sparse = [cols.separator.join(str(int(x)) for x in b) for b in bags]
                out.writerow(_label_text(chunk.rows.labels[i]) + dense + sparse)
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
            per_feature = list(zip(*_bags(chunk), strict=True))
            for f, bags in enumerate(per_feature):
                if multi[f]:
                    arrays.append(pa.array([b.tolist() for b in bags], pa.list_(pa.int64())))
                else:
                    arrays.append(
                        pa.array([int(b[0]) if b.size else None for b in bags], pa.int64())
                    )
            table = pa.Table.from_arrays(arrays, schema=schema)
            writer.write_table(table, row_group_size=row_group_size)
    return n
