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

from rec.config import RecConfig
from rec.data.errors import DataError
from rec.data.source import DataSource
from rec.data.synthetic import SyntheticSource, teacher_auc

__all__ = ["DataError", "DataSource", "SyntheticSource", "make_source", "teacher_auc"]


def make_source(cfg: RecConfig, split: str) -> DataSource:
    """The `split` ("train" or "eval") of the data set that `cfg.data` describes."""
    if split not in ("train", "eval"):
        raise ValueError(f"split={split!r} must be 'train' or 'eval'")
    if cfg.data.source == "synthetic":
        return SyntheticSource(cfg, split)
    raise NotImplementedError(f"data.source={cfg.data.source!r} is not implemented yet")
