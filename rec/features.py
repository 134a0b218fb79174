"""The feature spec's two parts that need more than the contract: its dense transforms as a
torch module, and the spec a config trains with.

The spec itself (its fields, the token encodings and their hash, `feature_spec.json`) is
rec.contract.features, which imports no torch so that every stage may read it; its names are
importable from here too. This module adds:

    DenseTransform   the dense transforms (identity, log1p), as the first op of the exported
                     model; `transform_dense` runs it on the raw values a training reader parses
    feature_spec     the spec of a RecConfig: its data source's columns and transforms

Example:
    >>> spec = FeatureSpec("csv", ["y"], [DenseFeature("x", "x", "log1p")], [], dict(HASH))
    >>> transform_dense(spec, np.array([[-1.0], [0.0]])).tolist()
    [[0.0], [0.0]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from rec.config import ConfigError
from rec.contract.features import (
    ENCODINGS,
    HASH,
    SPEC_FILE,
    TRANSFORMS,
    DenseFeature,
    FeatureSpec,
    SparseFeature,
    TokenError,
    encode_tokens,
    hash_id,
    hex_id,
    negative_ints,
    string_id,
)


# ---- dense: raw values -> model inputs ------------------------------------------------------
class DenseTransform(nn.Module):
    """The dense transforms, as the first op of the served model (TorchScript and ONNX).

    Training readers call the same module (`transform_dense`) on the raw values
    they parse, rounded to float32 first as a request would carry them, so training and
    serving compute the inputs with one piece of code.
    """

    def __init__(self, transforms: Sequence[str]) -> None:
        super().__init__()
        unknown = sorted(set(transforms) - set(TRANSFORMS))
        if unknown:
            raise ValueError(f"unknown dense transform(s) {unknown}; known: {TRANSFORMS}")
        mask = torch.tensor([t == "log1p" for t in transforms], dtype=torch.bool)
        self.register_buffer("log1p_mask", mask.reshape(1, -1), persistent=False)
        self.active = bool(mask.any())

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return dense
        wide = dense.to(torch.float64)
        logged = torch.log1p(torch.clamp(wide, min=0.0))
        return torch.where(self.log1p_mask, logged, wide).to(torch.float32)


def transform_dense(spec: FeatureSpec, raw: np.ndarray) -> np.ndarray:
    """Raw dense values [n, D] (any float dtype) -> the model's inputs [n, D] float32, by the
    module the exported model runs."""
    x = torch.from_numpy(np.ascontiguousarray(raw, dtype=np.float32))
    with torch.no_grad():
        return DenseTransform(spec.transforms)(x).numpy()


# ---- the spec of a config -------------------------------------------------------------------
def criteo_columns(num_tasks: int) -> tuple[list[str], list[str], list[str]]:
    """Criteo TSV's column names (labels, I1..I13, C1..C26), as messages name them."""
    labels = ["label"] if num_tasks == 1 else [f"label_{t}" for t in range(num_tasks)]
    return labels, [f"I{i + 1}" for i in range(13)], [f"C{i + 1}" for i in range(26)]


def check_criteo_shape(cfg) -> None:
    """Criteo lines carry 13 dense and 26 sparse features; the config must match."""
    dense, sparse = cfg.features.dense, len(cfg.features.sparse)
    if dense != 13 or sparse != 26:
        raise ConfigError(
            f"data.source='criteo_tsv' needs features.dense=13 and 26 sparse features "
            f"(Criteo's 13 integer and 26 categorical columns); the config has "
            f"features.dense={dense} and {sparse} sparse features"
        )


def feature_spec(cfg) -> FeatureSpec:
    """The spec `cfg` (a RecConfig) trains with: its data source's columns, the transforms of
    `features.transforms` (default log1p for Criteo TSV, identity otherwise)."""
    source = cfg.data.source
    default = "log1p" if source == "criteo_tsv" else "identity"
    names = list(cfg.features.dense_names)
    transforms = [cfg.features.transforms.get(n, default) for n in names]
    if source == "criteo_tsv":
        check_criteo_shape(cfg)
        labels, dense_cols, sparse_cols = criteo_columns(cfg.model.num_tasks)
        encoding, separator = "hex", None
    elif source in ("csv", "parquet"):
        cols = cfg.data.columns
        labels = cols.label_columns
        dense_cols = list(cols.dense) or names
        sparse_cols = [cols.sparse.get(f, f) for f in cfg.features.sparse]
        encoding, separator = "int_or_hash", cols.separator
    else:  # synthetic rows are model inputs already; a file of them uses the names as columns
        labels = criteo_columns(cfg.model.num_tasks)[0]
        dense_cols, sparse_cols = names, list(cfg.features.sparse)
        encoding, separator = "int_or_hash", cfg.data.columns.separator
    if len(dense_cols) != len(names):
        raise ConfigError(
            f"data.columns.dense lists {len(dense_cols)} columns {dense_cols} for "
            f"features.dense={len(names)}"
        )
    return FeatureSpec(
        format=source,
        labels=list(labels),
        dense=[
            DenseFeature(n, c, t) for n, c, t in zip(names, dense_cols, transforms, strict=True)
        ],
        sparse=[
            SparseFeature(f, c, encoding, separator)
            for f, c in zip(cfg.features.sparse, sparse_cols, strict=True)
        ],
        hash=dict(HASH),
        delimiter=cfg.data.delimiter,
    )


__all__ = [
    "ENCODINGS",
    "HASH",
    "SPEC_FILE",
    "TRANSFORMS",
    "DenseFeature",
    "DenseTransform",
    "FeatureSpec",
    "SparseFeature",
    "TokenError",
    "check_criteo_shape",
    "criteo_columns",
    "encode_tokens",
    "feature_spec",
    "hash_id",
    "hex_id",
    "negative_ints",
    "string_id",
    "transform_dense",
]
