"""rec.data: sources of RecBatch (synthetic, Criteo TSV, CSV, Parquet).

The trainer calls `make_source(cfg, "train" | "eval")` and then, on every rank,
`source.batches(batch_size, rank, world_size, start)`; see `rec.data.source` for the
position semantics that make the result independent of the world size.

Example:
    >>> from rec.config import default_config
    >>> src = make_source(default_config(), "eval")
    >>> src.num_samples()
    32768
    >>> len(next(src.batches(256, rank=1, world_size=2)))
    256
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rec.data.errors import DataError

if TYPE_CHECKING:
    from rec.config import RecConfig
    from rec.data.source import DataSource
    from rec.data.synthetic import SyntheticSource, teacher_auc
    from rec.data.writers import write_criteo_tsv, write_csv, write_parquet

# Loaded on first use (PEP 562): the sources import torch and torchrec (about 3 CPU-s), and every
# `rec` command imports DataError from here, most of them never reading a data set.
_LAZY = {"DataSource": "rec.data.source", "SyntheticSource": "rec.data.synthetic",
         "teacher_auc": "rec.data.synthetic", "write_criteo_tsv": "rec.data.writers",
         "write_csv": "rec.data.writers", "write_parquet": "rec.data.writers"}  # fmt: skip


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "DataError",
    "DataSource",
    "SyntheticSource",
    "make_source",
    "teacher_auc",
    "write_criteo_tsv",
    "write_csv",
    "write_parquet",
]


def make_source(cfg: RecConfig, split: str, raw_dense: bool = False) -> DataSource:
    """The `split` ("train" or "eval") of the data set that `cfg.data` describes.

    Dense values come transformed by the feature spec (rec.features), as the model trains on
    them; `raw_dense=True` leaves them as read, as a client sends them to the served model
    (which applies the transform itself).

    Raises ConfigError if the config does not fit the source (e.g. Criteo needs 13 dense and
    26 sparse features), DataError if a file is missing or lacks a configured column.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split={split!r} must be 'train' or 'eval'")
    source = cfg.data.source
    # File readers are imported on use: the synthetic path needs neither csv nor pyarrow.
    if source == "criteo_tsv":
        from rec.data.criteo import CriteoSource

        return CriteoSource(cfg, split, raw_dense)
    if source == "csv":
        from rec.data.tabular import CsvSource

        return CsvSource(cfg, split, raw_dense)
    if source == "parquet":
        from rec.data.tabular import ParquetSource

        return ParquetSource(cfg, split, raw_dense)
    from rec.data.synthetic import SyntheticSource

    return SyntheticSource(cfg, split, raw_dense)
