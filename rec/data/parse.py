"""Vectorised cell parsing shared by the file readers: numbers, hex ids, string ids, bags."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def log1p_dense(x: np.ndarray) -> np.ndarray:
    """Criteo's dense preprocessing, log1p(max(x, 0)), computed in f64 and stored as f32.

    The synthetic generator and the TSV reader both use this, so a round trip through a
    TSV file of integer counts reproduces the synthetic dense values bit for bit.
    """
    return np.log1p(np.maximum(x, 0).astype(np.float64)).astype(np.float32)


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


def string_id(token: str) -> int:
    """An id for one token: the integer it spells, else a stable 64-bit hash of its text.

    blake2b, not Python's hash(), so the same string maps to the same id in every process
    and every run.
    """
    try:
        value = int(token)
        if -(2**63) <= value < 2**63:
            return value
    except ValueError:
        pass
    digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def token_ids(tokens: Sequence[str]) -> np.ndarray:
    """int64 [n] ids of string tokens: integers as themselves, other strings hashed."""
    if not tokens:
        return np.zeros(0, dtype=np.int64)
    try:  # fast path: every token is an integer
        return np.array(tokens, dtype=str).astype(np.int64)
    except (ValueError, OverflowError):
        return np.array([string_id(t) for t in tokens], dtype=np.int64)


def split_bags(cells: Sequence[str], separator: str) -> tuple[np.ndarray, np.ndarray]:
    """Multi-valued cells ("12|7|3", "" for none) -> (lengths [n] i32, ids [sum] i64)."""
    if not any(separator in c for c in cells):
        lengths = np.array([c != "" for c in cells], dtype=np.int32)
        return lengths, token_ids([c for c in cells if c != ""])
    bags = [[t for t in c.split(separator) if t != ""] for c in cells]
    lengths = np.array([len(b) for b in bags], dtype=np.int32)
    return lengths, token_ids([t for b in bags for t in b])


def to_batch_major(lengths: np.ndarray, per_feature: list[np.ndarray]) -> np.ndarray:
    """Interleaves per-feature ids into the batch-major `values` of a RecBatch.

    Args:
        lengths: [n, F] ids per sample per feature.
        per_feature: F arrays; array f holds feature f's ids, sample after sample.
    Returns:
        values [sum(lengths)] i64: sample by sample, feature by feature within a sample.
    """
    flat = lengths.reshape(-1).astype(np.int64)
    starts = (np.cumsum(flat) - flat).reshape(lengths.shape)  # where bag (b, f) starts
    values = np.empty(int(flat.sum()), dtype=np.int64)
    for f, ids in enumerate(per_feature):
        n_f = lengths[:, f].astype(np.int64)
        if ids.size:
            # Value j of feature f belongs to sample b; it goes to starts[b, f] + its rank in b.
            shift = np.repeat(starts[:, f] - (np.cumsum(n_f) - n_f), n_f)
            values[shift + np.arange(ids.size)] = ids
    return values
