"""Vectorised cell parsing shared by the file readers: numbers and bags of ids.

How a token becomes an id, and a raw dense value a model input, is rec.features' job; how a
batch's ids are laid out (batch-major) is the contract's (rec.contract.features.to_batch_major)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rec.features import DenseTransform


def log1p_dense(counts: np.ndarray) -> np.ndarray:
    """Criteo's dense preprocessing of integer counts: rec.features' log1p transform.

    The synthetic generator uses this; the TSV reader applies the same transform (the feature
    spec's), so a round trip through a TSV file of the counts reproduces the synthetic dense
    values bit for bit.
    """
    return (
        DenseTransform(["log1p"] * counts.shape[-1])(
            torch.from_numpy(counts.astype(np.float32).reshape(-1, counts.shape[-1]))
        )
        .numpy()
        .reshape(counts.shape)
    )


def parse_floats(cells: np.ndarray, empty: float | None = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Text cells [...] (numpy bytes or str) -> (f64 values, bad mask), same shape.

    An empty cell becomes `empty`, or is bad if `empty` is None; a cell that is not a finite
    number is bad (its value is then 0).
    """
    blank = cells == cells.dtype.type("")
    filled = np.where(blank, cells.dtype.type("0"), cells)
    try:
        values = filled.astype(np.float64)
    except ValueError:  # at least one cell is not a number: find which, one by one
        values = np.zeros(cells.shape)
        flat, out = filled.reshape(-1), values.reshape(-1)
        for i, cell in enumerate(flat.tolist()):
            try:
                out[i] = float(cell)
            except ValueError:
                out[i] = np.nan
    bad = ~np.isfinite(values)
    if empty is None:
        bad |= blank
    else:
        values[blank] = empty
    values[bad] = 0.0
    return values, bad


def split_tokens(cells: Sequence[str], separator: str) -> tuple[np.ndarray, list[str]]:
    """Multi-valued cells ("12|7|3", "" for none) -> (lengths [n] i32, tokens [sum])."""
    if not any(separator in c for c in cells):
        lengths = np.array([c != "" for c in cells], dtype=np.int32)
        return lengths, [c for c in cells if c != ""]
    bags = [[t for t in c.split(separator) if t != ""] for c in cells]
    lengths = np.array([len(b) for b in bags], dtype=np.int32)
    return lengths, [t for b in bags for t in b]
