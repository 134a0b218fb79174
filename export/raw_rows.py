"""Export's raw-row round trip: held-out rows as a client holds them, through the serving
side's reader and encoding, must score exactly as the training readers' batches of them.

    raw file rows -> rec.data.raw.read_raw (tokens, raw dense) -> FeatureSpec.encode_values
                  -> exported model                                   ==  bit for bit
    raw file rows -> rec.data training reader (ids, raw dense)  -> exported model

The two readers are written independently (a vectorised one for training, a cell-by-cell one
for serving); both apply the one feature spec. Any difference in parsing, column mapping or id
encoding shows up as a score difference here, before the model reaches a server.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from rec.config import RecConfig
from rec.data import make_source
from rec.data.errors import DataError
from rec.data.files import resolve_paths
from rec.data.raw import read_raw
from rec.export.verify import Scorer, VerificationError
from rec.features import feature_spec

ROWS = 512


def round_trip(cfg: RecConfig, scorer: Scorer, rows: int = ROWS) -> dict[str, Any]:
    """Checks the first `rows` rows of the first held-out file (or training file); returns what
    rec.json records. Raises VerificationError when the two paths disagree."""
    if cfg.data.source == "synthetic":
        return {"skipped": "synthetic data has no raw rows"}
    if not (cfg.data.eval_paths or cfg.data.train_paths):
        return {
            "skipped": "the run names no data file (a stream run: its events are checked "
            "as they arrive, rec.contract.events)"
        }
    try:
        path = resolve_paths(cfg.data.eval_paths or cfg.data.train_paths)[0]
    except DataError as e:
        return {"skipped": f"the data files cannot be read where export ran ({e})"}
    spec = feature_spec(cfg)
    # The training reader over that one file, every row in order, raw dense values.
    one_file = dataclasses.replace(
        cfg.data, train_paths=[path], eval_paths=[path], on_bad_row="error"
    )
    single = dataclasses.replace(cfg, data=one_file)
    source = make_source(single, "eval", raw_dense=True)
    batch = next(source.batches(rows, rank=0, world_size=1, drop_last=False))
    raw = read_raw(path, spec, cfg.data.source, limit=len(batch.dense))
    ids = spec.encode_values(raw.lengths, raw.tokens)
    served = (torch.from_numpy(raw.dense), torch.from_numpy(raw.lengths), torch.from_numpy(ids))
    trained = (batch.dense, batch.lengths, batch.values)
    for name, a, b in zip(("dense", "lengths", "ids"), served, trained, strict=True):
        if not torch.equal(a.to(b.dtype), b):
            raise VerificationError(_first_difference(name, path, a, b))
    with torch.no_grad():
        scores, expected = scorer(*served), scorer(batch.dense, batch.lengths, batch.values)
    if not torch.equal(scores, expected):
        raise VerificationError(f"raw rows of {path}: served scores differ from training's")
    return {"file": path, "format": cfg.data.source, "rows": len(raw), "identical": True}


def _first_difference(name: str, path: str, a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return (
            f"raw rows of {path}: the serving reader's {name} has shape {list(a.shape)}, "
            f"the training reader's {list(b.shape)}"
        )
    at = np.argwhere((a.to(b.dtype) != b).numpy())[0].tolist()
    return (
        f"raw rows of {path}: {name} at {at} is {a[tuple(at)].item()!r} from the serving "
        f"reader and {b[tuple(at)].item()!r} from the training reader"
    )
